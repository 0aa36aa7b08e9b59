"""The compiled hot path (gateway.native): the suite runs on the build, never on a stale one."""

from __future__ import annotations

import importlib.machinery
import os
import shutil
import sys
from pathlib import Path
from typing import BinaryIO

import orjson
import pytest

from gateway import log, native
from gateway.prompt.prefix_keys import chain_hash_text
from gateway.relay.headers import filtered, request_id
from gateway.relay.sse_usage import SSEUsageScanner
from gateway.request.decision import Decision, Score
from gateway.request.timing import Timing
from gateway.request.usage import Usage


def test_the_suite_runs_every_hot_module_compiled() -> None:
    # `make test` builds first (`make native`) wherever there is a C compiler: the suite tests the code the
    # gateway runs, not its interpreted twin.
    if shutil.which("cc") is None:
        pytest.skip("no C compiler: the gateway and the suite run the hot path interpreted")
    running = native.compiled()
    assert len(running) == len(native.HOT_MODULES), f"compiled: {running}"


def test_a_build_older_than_any_source_of_the_package_is_stale(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    hot, other = package / "sub" / "hot.py", package / "other.py"
    hot.write_text("")
    other.write_text("")
    built = package / "sub" / f"hot{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    built.write_bytes(b"")
    os.utime(hot, (100, 100))
    os.utime(other, (100, 100))
    os.utime(built, (200, 200))
    assert native.stale(package, ("pkg/sub/hot.py",)) == []
    os.utime(other, (300, 300))  # not the compiled module itself: what it calls may have changed
    assert native.stale(package, ("pkg/sub/hot.py",)) == ["pkg/sub/hot.py"]
    built.unlink()  # nothing built: nothing stale, the module runs interpreted
    assert native.stale(package, ("pkg/sub/hot.py",)) == []


def test_a_bytes_concatenation_in_the_generated_c_is_found(tmp_path: Path) -> None:
    (tmp_path / "gateway").mkdir()
    (tmp_path / "gateway" / "__native_x.c").write_text(
        "    cpy_r_r3 = CPyBytes_Concat(cpy_r_r1, cpy_r_r2);\n"
        "    if (unlikely(cpy_r_r3 == NULL)) {\n"
        '        CPy_AddTraceback("gateway/log.py", "_write_line", 108, CPyStatic_log___globals);\n'
        "    cpy_r_r4 = PyBytes_Join(cpy_r_r0, cpy_r_r1);\n"
    )
    assert native.leaking_concatenations(tmp_path) == ["gateway/log.py:108 (_write_line)"]


def test_the_compiled_request_path_leaks_nothing(tmp_path: Path) -> None:
    """Compiled, each request's answer reading once leaked its bytes (mypyc's `bytes + bytes`): a gateway's
    memory grew by a kB per request. What the compiled modules do per request, 2,000 times: the allocated
    blocks before and after."""
    event = b'data: {"choices":[{"index":0,"text":" ok","finish_reason":null}],"usage":null}\n\n'
    usage_event = b'data: {"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":4}}\n\n'
    stream = event * 4 + usage_event + b"data: [DONE]\n\n"
    whole = orjson.dumps({"choices": [{"text": " ok"}], "usage": {"prompt_tokens": 8}})
    prompt = "You are a helpful assistant. " * 40 + "é"
    headers = [("Host", "x"), ("Connection", "keep-alive, x-hop"), ("X-Hop", "1"), ("Content-Type", "a/b")]

    def one_round(out: BinaryIO) -> None:
        for collect in (True, False):
            usage = Usage(answer=[] if collect else None)
            scanner = SSEUsageScanner(usage)
            scanner.feed(stream[:50])  # a tail carried from one batch to the next
            scanner.feed(stream[50:])
            scanner.flush()
            usage.read_body(whole)
        log._write_line(out, "request", {"request_id": "r", "status": 200})
        chain_hash_text(prompt, 64, 7, 64)
        filtered(headers, frozenset({"connection", "host"}))
        request_id(None)
        decision = Decision("a", "prefix_hit", (Score("a", 0.1, 1.0, 64, 0.0), Score("b", 0.2))).with_evidence("x")
        decision.candidates()
        decision.header_value()
        Timing.of(0.001, 0.01, 0.05, True, 4)

    with (tmp_path / "log").open("wb") as out:
        for _ in range(200):
            one_round(out)
        before = sys.getallocatedblocks()
        for _ in range(2000):
            one_round(out)
        grown = sys.getallocatedblocks() - before
    assert grown < 500
