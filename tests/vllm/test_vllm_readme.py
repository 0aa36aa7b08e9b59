"""The README's "Calling it" examples, exactly as printed (its curl command line and its openai SDK
snippet, model `smollm2`), run against the gateway in front of real vLLM: the README says they
work unchanged with `up --engine vllm`. Only the address changes, to the session gateway's."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT
from tests.integration.gateway_procs import Gateway

pytestmark = pytest.mark.timeout(420)  # may be the first vLLM test: waits for the session's start-up
README_URL = "http://127.0.0.1:8000"


def readme_example(language: str) -> str:
    """The first `language` code block of the README's "Calling it" section."""
    section = (ROOT / "README.md").read_text().split("\n## Calling it\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(rf"```{language}\n(.*?)```", section, re.DOTALL)
    assert found, f"no {language} block under 'Calling it'"
    return found.group(1)


def test_the_readme_curl_example(gateway: Gateway) -> None:
    command = readme_example("sh")
    assert README_URL in command and '"model": "smollm2"' in command
    out = subprocess.run(
        ["sh", "-c", command.replace(README_URL, gateway.url)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["object"] == "chat.completion" and answer["model"] == "smollm2", answer
    assert answer["choices"][0]["message"]["content"] and answer["choices"][0]["finish_reason"] in ("stop", "length")
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] is not None, answer["usage"]


def test_the_readme_openai_streaming_example_hits_the_cache_the_second_time(gateway: Gateway) -> None:
    snippet = readme_example("python")
    assert README_URL in snippet and 'model="smollm2"' in snippet
    out = subprocess.run(
        [sys.executable, "-c", snippet.replace(README_URL, gateway.url)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    usage = [tuple(map(int, u)) for u in re.findall(r"\[prompt (\d+), cached (\d+)\]", out.stdout)]
    answers = re.split(r"\n\[prompt \d+, cached \d+\]\n?", out.stdout)[:2]
    assert len(usage) == 2, out.stdout
    (prompt, first), (again, second) = usage
    assert prompt == again > 800 and first == 0, usage  # the README's ~850-token librarian prompt, cold
    assert second >= prompt - 128, usage  # all but the last (partial) 128-token block came from the cache
    assert answers[0] and answers[0] == answers[1], answers  # greedy: the same answer
