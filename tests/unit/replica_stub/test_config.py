from __future__ import annotations

from pathlib import Path

import pytest

from replica_stub.cli import main, parse_args
from replica_stub.config import load_config


def _overrides(argv: list[str]) -> dict:
    args = parse_args(argv)
    return {k: v for k, v in vars(args).items() if k not in ("command", "config") and v is not None}


def test_serve_is_the_default_subcommand() -> None:
    assert parse_args(["--port", "9"]).command == "serve"
    assert parse_args(["serve", "--port", "9"]).port == 9


def test_defaults_and_derived_values() -> None:
    config = load_config(None, _overrides(["--port", "8123"]))
    assert (config.replica_id, config.block_size, config.max_model_len) == ("replica-8123", 16, 8192)
    small = load_config(None, _overrides(["--num-gpu-blocks", "10"]))
    assert small.max_model_len == 160  # clamped to the KV capacity


def test_yaml_file_is_overridden_by_flags(tmp_path: Path) -> None:
    path = tmp_path / "stub.yaml"
    path.write_text("max_num_seqs: 8\nspeedup: 4\ntiming:\n  decode_base_ms: 10\n  prefill_base_ms: 5\n")
    config = load_config(str(path), _overrides(["--speedup", "50", "--prefill-base-ms", "7"]))
    assert (config.max_num_seqs, config.speedup) == (8, 50)
    assert (config.timing.decode_base_ms, config.timing.prefill_base_ms) == (10, 7)


def test_batching_is_continuous_unless_the_flag_or_the_file_says_static(tmp_path: Path) -> None:
    assert load_config(None, {}).batching == "continuous"
    assert load_config(None, _overrides(["--batching", "static"])).batching == "static"
    path = tmp_path / "stub.yaml"
    path.write_text("batching: static\n")
    assert load_config(str(path), {}).batching == "static"


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("max_num_seq: 3\n", "unknown setting(s) max_num_seq"),
        ("timing: {decode_ms: 3}\n", "timing.decode_ms"),
        ("block_size: 0\n", "block_size must be >= 1"),
        ("num_gpu_blocks: 4\nmax_model_len: 100\n", "exceeds the KV capacity"),
        ("batching: dynamic\n", "batching must be one of continuous, static"),
    ],
    ids=["typo", "timing-typo", "zero", "too-long", "batching"],
)
def test_bad_settings_name_the_key(tmp_path: Path, yaml_text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(str(path), {})


def test_cli_reports_bad_settings_without_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--speedup", "0"]) == 2
    assert "speedup must be > 0" in capsys.readouterr().err
