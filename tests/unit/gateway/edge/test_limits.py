"""Prompt-length estimate and limit; config validation of the limit, admission and shutdown keys."""

from __future__ import annotations

import pytest

from gateway.config.loader import parse_config
from gateway.config.pools import PrefixConfig
from gateway.config.sections import LimitsConfig
from gateway.edge.limits import check_prompt, estimate_prompt
from gateway.errors import BadRequestError, ConfigError
from gateway.view import RequestView


def _view(endpoint: str, body: dict[str, object]) -> RequestView:
    return RequestView("r", endpoint, "m", False, body, b"")


def test_estimate_counts_token_ids_exactly_and_text_by_characters() -> None:
    assert estimate_prompt(_view("completions", {"prompt": list(range(37))}), PrefixConfig()) == 37
    assert estimate_prompt(_view("completions", {"prompt": "x" * 41}), PrefixConfig(chars_per_token=4)) == 11
    assert estimate_prompt(_view("embeddings", {"input": "anything"}), PrefixConfig()) == 2  # its input
    assert estimate_prompt(_view("rerank", {"query": "q", "documents": ["d"]}), PrefixConfig()) == 0


def test_prompt_over_the_limit_is_400_naming_the_field() -> None:
    limits = LimitsConfig(max_prompt_tokens=10)
    check_prompt(_view("completions", {"prompt": "x" * 40}), PrefixConfig(), limits)
    with pytest.raises(BadRequestError) as info:
        check_prompt(_view("chat", {"messages": [{"role": "user", "content": "x" * 80}]}), PrefixConfig(), limits)
    assert info.value.param == "messages"
    check_prompt(_view("completions", {"prompt": "x" * 10**5}), PrefixConfig(), LimitsConfig())  # 0 = no limit


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"limits": {"client_body_timeout_s": 0}}, "limits.client_body_timeout_s"),
        ({"limits": {"max_prompt_tokens": -1}}, "limits.max_prompt_tokens"),
        ({"health": {"failure_window_s": 0}}, "health.failure_window_s"),
        ({"admission": {"max_queue": -1}}, "admission.max_queue"),
        ({"admission": {"queue_timeout_s": 0}}, "admission.queue_timeout_s"),
        ({"shutdown": {"grace_s": 0}}, "shutdown.grace_s"),
        ({"shutdown": {"ready_delay_s": -1}}, "shutdown.ready_delay_s"),
    ],
)
def test_bad_values_name_their_key(section: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"pools": {"m": {"replicas": [{"url": "http://a:1"}]}}, **section})
    assert info.value.key == key
