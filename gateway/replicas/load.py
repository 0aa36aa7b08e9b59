"""The replica's own view of its load, read from its Prometheus /metrics.

Tolerant by design: metric names changed across vLLM releases (production-stack#617), several
engines (`engine` label) are summed, unknown lines are skipped, and a missing metric reads as 0.
"""

from __future__ import annotations

import re
import time

import aiohttp

from gateway.replicas.replica import Replica, ReplicaLoad

RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
CACHE_INFO = "vllm:cache_config_info"
COMPLETED = "vllm:request_success_total"

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> ReplicaLoad:
    """Prometheus text exposition → ReplicaLoad; sums over engines, averages KV usage."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    load = ReplicaLoad()
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        match = _LINE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        if name == CACHE_INFO and labels:
            info = dict(_LABEL.findall(labels))
            load.num_gpu_blocks = _int(info.get("num_gpu_blocks"))
            load.block_size = _int(info.get("block_size"))
            continue
        try:
            number = float(value)
        except ValueError:
            continue
        sums[name] = sums.get(name, 0.0) + number
        counts[name] = counts.get(name, 0) + 1
    load.running = int(_first(sums, RUNNING))
    load.waiting = int(_first(sums, WAITING))
    kv_name = next((n for n in KV_USAGE if n in sums), None)
    load.kv_usage = sums[kv_name] / counts[kv_name] if kv_name else 0.0
    load.completed = sums.get(COMPLETED)
    return load


async def scrape(session: aiohttp.ClientSession, replica: Replica, path: str, timeout_s: float) -> bool:
    """Refresh `replica.load`; on failure keep the exact in-flight count only (zeros), return False."""
    try:
        async with session.get(replica.url + path, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                raise aiohttp.ClientResponseError(resp.request_info, (), status=resp.status)
            text = await resp.text()
    except (aiohttp.ClientError, TimeoutError):
        replica.load = ReplicaLoad(num_gpu_blocks=replica.load.num_gpu_blocks, block_size=replica.load.block_size)
        return False
    load = parse_metrics(text)
    load.scraped_at = time.monotonic()
    if load.num_gpu_blocks is None:  # keep the last known cache shape
        load.num_gpu_blocks, load.block_size = replica.load.num_gpu_blocks, replica.load.block_size
    replica.load = load
    return True


def _first(sums: dict[str, float], names: tuple[str, ...]) -> float:
    return next((sums[n] for n in names if n in sums), 0.0)


def _int(text: str | None) -> int | None:
    try:
        return int(float(text)) if text is not None else None
    except ValueError:
        return None
