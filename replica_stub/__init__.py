"""A vLLM-compatible inference replica for tests, demos and benchmarks.

It serves the parts of `vllm serve` a router touches (OpenAI endpoints, streaming, /metrics,
prefix-cache hit counts) on top of a block-based prefix cache and a continuous-batching
scheduler; the engine behind them is pluggable (a calibrated simulator today).
"""

__version__ = "0.1.0"
