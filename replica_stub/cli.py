"""`replica-stub [serve] --port P --model NAME ...`: parse flags, build the config, run the app.

The first positional argument selects a subcommand; `serve` is the default, so
`replica-stub --port 8001` works. `calibrate` times the real engine and writes the
simulator's timing parameters.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import structlog
from aiohttp import web

from gateway.log import setup_logging
from replica_stub.config import DTYPES, StubConfig, load_config
from replica_stub.engine.registry import ENGINES
from replica_stub.engine.timing import TimingModel
from replica_stub.kv_events import ENCODINGS
from replica_stub.scheduler import BATCHING

SUBCOMMANDS = ("serve", "calibrate")
_TIMING_HELP = {
    "prefill_base_ms": "fixed cost of a step that prefills",
    "prefill_token_ms": "prefill cost per uncached prompt token",
    "prefill_attention_ms": "prefill attention cost: ms per n*(c+n/2)/1000",
    "decode_base_ms": "fixed cost of a decode-only step",
    "decode_context_ms": "decode cost per 1000 context tokens of each sequence",
    "decode_seq_ms": "extra cost per additional sequence in a decode batch",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="replica-stub",
        description="A vLLM-compatible replica for tests and benchmarks.",
        epilog="`serve` is the default subcommand; see `replica-stub serve --help`.",
    )
    sub = parser.add_subparsers(dest="command")
    serve = sub.add_parser("serve", help="run the replica server (default)")
    serve.add_argument("--config", help="YAML file with settings (flags override it)")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default 8000)")
    serve.add_argument("--model", help="served model name (default stub-model)")
    serve.add_argument("--replica-id", help="X-Replica-Id value (default replica-<port>)")
    serve.add_argument(
        "--engine",
        choices=ENGINES,
        help="engine implementation (default auto: real if the model is installed, else sim)",
    )
    serve.add_argument("--speedup", type=float, help="run simulated time this many times faster (default 1)")
    serve.add_argument("--block-size", type=int, help="tokens per KV block (default 16)")
    serve.add_argument("--num-gpu-blocks", type=int, help="KV capacity in blocks (default 4096)")
    serve.add_argument("--max-num-seqs", type=int, help="max running sequences (default 256)")
    serve.add_argument("--max-num-batched-tokens", type=int, help="token budget per step (default 2048)")
    serve.add_argument("--max-model-len", type=int, help="max prompt+output tokens (default min(8192, KV capacity))")
    serve.add_argument(
        "--batching",
        choices=BATCHING,
        help="continuous (default): requests join and leave the running batch at every step; "
        "static: a batch runs until its longest request ends, later requests wait for it",
    )
    serve.add_argument("--kv-cache-mb", type=float, help="real engine: KV cache memory in MiB (default 256)")
    serve.add_argument("--torch-threads", type=int, help="real engine: torch threads (default min(2, CPUs))")
    serve.add_argument(
        "--dtype",
        choices=DTYPES,
        help="real engine: weights and KV dtype (default auto: bfloat16 where the CPU has avx512_bf16 "
        "or AMX, else float32, ~5x faster there than emulated bf16)",
    )
    serve.add_argument("--log-level", choices=("debug", "info", "warning", "error"), help="default info")
    serve.add_argument(
        "--kv-events-endpoint",
        help="publish vLLM KV events on this ZMQ PUB endpoint, bound (e.g. tcp://*:5557; default off)",
    )
    serve.add_argument(
        "--kv-events-replay-endpoint", help="ZMQ ROUTER endpoint answering replay requests (default off)"
    )
    serve.add_argument("--kv-events-topic", help="topic frame of every KV event message (default empty)")
    serve.add_argument(
        "--kv-events-encoding",
        choices=ENCODINGS,
        help="events as vLLM's tagged arrays (<= 0.11) or tagged maps (newer) (default array)",
    )
    serve.add_argument("--kv-events-buffer-steps", type=int, help="batches kept for replay (default 10000)")
    serve.add_argument(
        "--fail-on-marker",
        help="answer 500 to a generation request whose body contains this text "
        "(an input-dependent engine fault, for tests; default off)",
    )
    serve.add_argument(
        "--api-key",
        help="require `Authorization: Bearer KEY` on /v1/* routes, as vLLM's "
        "--api-key does: 401 without it (default open)",
    )
    serve.add_argument(
        "--lora-modules",
        nargs="+",
        metavar="NAME=PATH",
        help="serve these LoRA adapters as vLLM's --lora-modules does (the sim engine's adapter is a "
        "name that changes its text and its cache keys; default none)",
    )
    for field in dataclasses.fields(TimingModel):
        flag = "--" + field.name.replace("_", "-")
        serve.add_argument(flag, type=float, help=f"{_TIMING_HELP[field.name]} (default {field.default})")
    calibrate = sub.add_parser("calibrate", help="time the real engine here; write the simulator's timing YAML")
    calibrate.add_argument("--output", default="calibration.yaml", help="YAML to write (default calibration.yaml)")
    calibrate.add_argument("--torch-threads", type=int, default=2, help="torch threads (default 2)")
    calibrate.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default 16)")
    calibrate.add_argument("--quick", action="store_true", help="a small grid (seconds, for smoke tests)")
    calibrate.add_argument(
        "--results",
        metavar="NAME",
        help="in a checkout of the project: also publish the table into docs/benchmarks/results/NAME.json and .md",
    )
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    argv = list(argv)
    if not argv or argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help"):
        argv.insert(0, "serve")
    return build_parser().parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "calibrate":
        from replica_stub.calibrate import run_calibration

        run_calibration(
            Path(args.output),
            threads=args.torch_threads,
            block_size=args.block_size,
            quick=args.quick,
            results_name=args.results,
        )
        return 0
    overrides = {k: v for k, v in vars(args).items() if k not in ("command", "config") and v is not None}
    try:
        config = load_config(args.config, overrides)
    except (OSError, ValueError, TypeError) as exc:
        print(f"replica-stub: {exc}", file=sys.stderr)
        return 2
    setup_logging(config.log_level)
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(config))
    else:
        uvloop.run(serve(config))
    return 0


async def serve(config: StubConfig) -> None:
    from replica_stub.generation import CONFIG
    from replica_stub.server import make_app

    app = make_app(config)
    config = app[CONFIG]  # the engine fixes its name and, for the real one, the KV capacity
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    # Streams allocate many short-lived acyclic objects: collect young objects less often, and
    # keep the long-lived block pool and imports out of full passes (each costs tens of ms).
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    await web.TCPSite(runner, config.host, config.port, backlog=4096).start()
    structlog.get_logger("replica_stub").info(
        "replica_started",
        replica_id=config.replica_id,
        host=config.host,
        port=config.port,
        model=config.model,
        engine=config.engine,
        speedup=config.speedup,
        block_size=config.block_size,
        num_gpu_blocks=config.num_gpu_blocks,
        max_num_seqs=config.max_num_seqs,
        max_model_len=config.max_model_len,
        batching=config.batching,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
