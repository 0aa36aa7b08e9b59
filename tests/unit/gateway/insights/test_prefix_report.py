"""gateway.insights.prefix_report: what is a finding and what is not, bounds, and the CLI's table."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.cli.prefix_report import table
from gateway.config.features import PrefixReportConfig
from gateway.config.loader import parse_config
from gateway.config.pools import PrefixConfig, PricesConfig
from gateway.errors import ConfigError
from gateway.insights.prefix_report import PrefixReport, prepare
from gateway.prompt.prefix_keys import attach, compute
from gateway.view import RequestView

pytestmark = pytest.mark.timeout(10)
SYSTEM = "\n".join(f"Rule {i}: cite the handbook, section {i}, and nothing else." for i in range(120))


def offer(report: PrefixReport, tenant: str, messages: list[dict[str, Any]]) -> None:
    view = RequestView("r", "chat", "m", False, {"model": "m", "messages": messages}, b"", tenant=tenant)
    attach(view, compute(view, PrefixConfig()))
    report.offer(tenant, "m", view, 4.0, 0.001, PricesConfig(input=2.0, cached_input=0.5, output=8.0))


def drain(report: PrefixReport) -> dict[str, Any]:
    """What the app's background task does: prepare (in a thread there), then compare."""
    while report._queue:
        item = report._queue.popleft()
        prepared = prepare(item)
        assert prepared is not None
        report.compare(item, *prepared)
    return report.report()


def test_a_growing_conversation_and_different_questions_are_no_finding() -> None:
    report = PrefixReport(PrefixReportConfig())
    turns: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for i in range(4):
        turns = [*turns, {"role": "user", "content": f"question {i}?"}]
        offer(report, "chat", turns)
        offer(report, "faq", [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"other {i}?"}])
    assert drain(report)["families"] == [] and report.analysed == 8


def test_a_user_name_on_top_is_priced_at_the_prefill_rate_and_the_cache_discount() -> None:
    report = PrefixReport(PrefixReportConfig(min_tokens=100))
    for name in ("Ann", "Bob"):
        offer(report, "crm", [{"role": "system", "content": f"The user is {name}.\n{SYSTEM}"}])
    (row,) = drain(report)["families"]
    assert row["divergence"]["block"] == 0 and row["affected_requests"] == 1
    tokens = row["recoverable_tokens"]
    assert tokens == pytest.approx(len(SYSTEM) / 4, rel=0.02)
    assert row["lost"]["prefill_s"] == pytest.approx(tokens * 0.001) and row["lost"]["cost"] == pytest.approx(
        tokens * 1.5 / 1e6
    )
    printed = table(report.report())
    assert "crm" in printed and "around" not in printed


def test_the_queue_is_bounded_and_skips_are_counted() -> None:
    report = PrefixReport(PrefixReportConfig(queue=2))
    for i in range(5):
        offer(report, "t", [{"role": "user", "content": SYSTEM + str(i)}])
    assert report.report()["pending_requests"] == 2 and report.skipped == 3
    drain(report)
    view = RequestView("big", "completions", "m", False, {}, b" " * (2 << 20), block_hashes=(1, 2))
    report.offer("t", "m", view, 4.0, None, None)  # a body over 1 MiB is not held for analysis
    assert report.report()["pending_requests"] == 0 and report.skipped == 4


@pytest.mark.parametrize("name", ["families", "samples", "queue", "min_tokens"])
def test_bounds_are_checked_by_key(name: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"pools": {"m": {"replicas": [{"url": "http://h:1"}]}}, "prefix_report": {name: 0}})
    assert err.value.key == f"prefix_report.{name}"


def test_interleaved_system_prompts_of_one_tenant_each_meet_their_siblings() -> None:
    report = PrefixReport(PrefixReportConfig(samples=8))
    prompts = [
        "\n".join(f"Desk {d} rule {i}: answer questions about product line {d} only." for i in range(60))
        for d in range(6)
    ]
    for second in range(2):
        for prompt in prompts:  # six families in turn: each one's sibling is five prompts back
            offer(report, "acme", [{"role": "system", "content": f"Now: 12:00:0{second}\n{prompt}"}])
    rows = drain(report)["families"]
    assert len(rows) == 6 and {r["affected_requests"] for r in rows} == {1}
    assert len({r["family"] for r in rows}) == 6
