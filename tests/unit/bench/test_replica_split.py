"""The replicas' share of a real-vLLM run, read from vLLM's own periodic log lines."""

from __future__ import annotations

import pytest

from bench.replica_split import render, split

pytestmark = pytest.mark.timeout(10)


def _throughput(replica: int, prompt: float, generated: float) -> str:
    return (
        f"[vllm-{replica}] (APIServer pid=1) INFO 12-06 17:13:14 [loggers.py:335] Engine 000: Avg prompt throughput: "
        f"{prompt} tokens/s, Avg generation throughput: {generated} tokens/s, Running: 0 reqs, Waiting: 0 reqs"
    )


def test_each_run_sums_its_replicas_tokens_from_its_own_start() -> None:
    log = [
        _throughput(0, 99.0, 9.0),  # before any run: ignored
        "[vllm-0] (APIServer pid=1) INFO 12-06 16:14:26 [api_utils.py:286] non-default args: {}",
        _throughput(0, 30.0, 3.0),
        _throughput(1, 10.0, 1.0),
        _throughput(0, 10.0, 1.0),
        '[gateway] {"event": "request"}',
        "[vllm-0] (APIServer pid=2) INFO 12-06 16:18:01 [api_utils.py:286] non-default args: {}",
        _throughput(1, 5.0, 0.5),
        _throughput(0, 5.0, 0.5),
    ]
    runs = split(log)
    assert runs == [{0: (400.0, 40.0), 1: (100.0, 10.0)}, {0: (50.0, 5.0), 1: (50.0, 5.0)}]
    table = render(runs, ["smg"])
    assert "| smg #1 | 400 / 100 | 1.60 | 40 / 10 | 1.60 |" in table
    assert "| smg #2 | 50 / 50 | 1.00 | 5 / 5 | 1.00 |" in table
