"""`--dtype auto`: bfloat16 only where this CPU computes it natively, float32 elsewhere.

Without native bf16 (AVX2-only CPUs), oneDNN falls back to emulation and a bf16 prefill runs
about 5x slower than float32 (measured: the README's ~850-token prompt, cold TTFT 14.2 s in
bf16 against 2.6 s in float32; vLLM's CPU build ~40 against ~200 tokens/s). The stub's real
engine and `up --engine vllm` both pick by this rule.
"""

from __future__ import annotations

from pathlib import Path

AUTO = "auto"
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The feature flags of /proc/cpuinfo (empty where there is none, e.g. not Linux)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def resolve_dtype(dtype: str, cpuinfo: str | None = None) -> str:
    """`auto` -> bfloat16 with avx512_bf16 or AMX, else float32; any other value is kept."""
    if dtype != AUTO:
        return dtype
    return "bfloat16" if cpu_flags(cpuinfo) & NATIVE_BF16_FLAGS else "float32"
