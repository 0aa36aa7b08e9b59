"""One result format for `bench` (real clients) and `simulate` (virtual time): per-request
records, a summary with latency percentiles, throughput, cache hits and load share, and JSON.

Times are seconds from the start of the run. `scheduled_s` is when the workload wanted the
request sent and `sent_s` when it was: their difference is the client's own lag, reported so a
reader can see the client kept up with the rate it claims.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.config.pools import PricesConfig

EXAMPLE_PRICES = PricesConfig(input=3.0, cached_input=0.3, output=15.0)  # per million tokens: `bench --prices`' default


@dataclass(slots=True)
class Result:
    session_id: str
    turn: int
    ok: bool
    status: int = 0
    scheduled_s: float = 0.0
    sent_s: float = 0.0
    ttft_s: float | None = None
    e2e_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)  # gaps between streamed chunks after the first
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    replica: str = ""
    error: str = ""
    predicted_cached_tokens: int | None = None  # the router's prediction (simulate only)


@dataclass(slots=True)
class Summary:
    requests: int
    errors: int
    duration_s: float
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    itl_p50_s: float
    itl_p90_s: float
    itl_p99_s: float
    e2e_p50_s: float
    e2e_p90_s: float
    e2e_p99_s: float
    requests_per_s: float
    output_tokens_per_s: float
    cached_ratio: float  # sum of cached prompt tokens / sum of prompt tokens
    target_session_rate: float  # sessions per second the workload asks for (0: concurrency mode)
    achieved_session_rate: float  # sessions per second the client actually started
    lag_p50_s: float  # sent_s - scheduled_s: how late the client sent requests
    lag_p99_s: float
    lag_max_s: float
    replica_share: dict[str, int] = field(default_factory=dict)
    prediction_error_tokens: float | None = None  # mean |predicted - reported cached tokens| (simulate only)
    # TTFT of a session's later requests (turns after the first), None when every session has one: where
    # routing can reuse a conversation's own history (first turns carry a prefix no replica holds yet).
    later_ttft_p90_s: float | None = None
    prompt_tokens: int = 0  # summed over the answered requests, as the replicas reported them
    cached_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None  # at the run's prices (`price`): what the tokens cost, and what the cache saved
    saved_by_cache: float | None = None
    saved_share_of_prompt_cost: float | None = None  # saved / what the prompts would cost uncached

    def price(self, prices: PricesConfig) -> None:
        """Cost and savings of the run's reported usage (`gateway.insights.token_costs` arithmetic)."""
        self.cost = prices.cost(self.prompt_tokens, self.cached_tokens, self.completion_tokens)
        self.saved_by_cache = prices.saved(self.cached_tokens)
        full = self.prompt_tokens * prices.input / 1e6
        self.saved_share_of_prompt_cost = self.saved_by_cache / full if full else 0.0

    @property
    def busiest_over_mean(self) -> float:
        """The busiest replica's requests over the mean; 0.0 when no answer named its replica (a router in
        front of vLLM, which names none), shown as "-"."""
        return busiest_over_mean(list(self.replica_share.values()))

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "busiest_over_mean": round(self.busiest_over_mean, 4)}


def summarise(results: list[Result], *, target_session_rate: float = 0.0, replicas: list[str] | None = None) -> Summary:
    """`replicas`: every replica of the pool, so one that got nothing counts in the load share."""
    ok = [r for r in results if r.ok]
    ttfts = sorted(r.ttft_s for r in ok if r.ttft_s is not None)
    later = sorted(r.ttft_s for r in ok if r.ttft_s is not None and r.turn > 0)
    e2es = sorted(r.e2e_s for r in ok)
    itls = sorted(gap for r in ok for gap in r.itl_s)
    lags = sorted(max(0.0, r.sent_s - r.scheduled_s) for r in results)
    starts = sorted(r.sent_s for r in results if r.turn == 0)
    duration = max((r.sent_s + r.e2e_s for r in results), default=0.0) - (starts[0] if starts else 0.0)
    achieved = (len(starts) - 1) / (starts[-1] - starts[0]) if len(starts) > 1 and starts[-1] > starts[0] else 0.0
    prompt = sum(r.prompt_tokens for r in ok)
    share = Counter({name: 0 for name in replicas or ()})
    share.update(r.replica for r in ok if r.replica)  # an answer that names no replica is in no replica's share
    errors = [abs(r.predicted_cached_tokens - r.cached_tokens) for r in ok if r.predicted_cached_tokens is not None]
    return Summary(
        requests=len(results),
        errors=len(results) - len(ok),
        duration_s=duration,
        ttft_p50_s=quantile(ttfts, 0.50),
        ttft_p90_s=quantile(ttfts, 0.90),
        ttft_p99_s=quantile(ttfts, 0.99),
        itl_p50_s=quantile(itls, 0.50),
        itl_p90_s=quantile(itls, 0.90),
        itl_p99_s=quantile(itls, 0.99),
        e2e_p50_s=quantile(e2es, 0.50),
        e2e_p90_s=quantile(e2es, 0.90),
        e2e_p99_s=quantile(e2es, 0.99),
        requests_per_s=len(ok) / duration if duration > 0 else 0.0,
        output_tokens_per_s=sum(r.completion_tokens for r in ok) / duration if duration > 0 else 0.0,
        cached_ratio=sum(r.cached_tokens for r in ok) / prompt if prompt else 0.0,
        target_session_rate=target_session_rate,
        achieved_session_rate=achieved,
        lag_p50_s=quantile(lags, 0.50),
        lag_p99_s=quantile(lags, 0.99),
        lag_max_s=lags[-1] if lags else 0.0,
        replica_share=dict(sorted(share.items())),
        prediction_error_tokens=statistics.fmean(errors) if errors else None,
        later_ttft_p90_s=quantile(later, 0.90) if later else None,
        prompt_tokens=prompt,
        cached_tokens=sum(r.cached_tokens for r in ok),
        completion_tokens=sum(r.completion_tokens for r in ok),
    )


def median_of(summaries: list[Summary]) -> Summary:
    """One summary of several runs of the same contestant: each figure the median of the runs' (a run's
    own percentiles first, then their median across runs, so one noisy run moves no row); a figure some runs
    lack (None) is the median of those that have it. Counts stay whole. The replica share is the one of the
    run whose busiest ÷ mean is the median (the lower of two): each replica's own median would mix runs
    whose busiest replica differs (a router that piled every request on replica-0 in one round and on
    replica-1 in the next read as having sent none at all)."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(Summary):
        got = [getattr(s, f.name) for s in summaries]
        if f.name == "replica_share":
            _, middle = statistics.median_low((s.busiest_over_mean, i) for i, s in enumerate(summaries))
            values[f.name] = dict(summaries[middle].replica_share)
            continue
        present = [g for g in got if g is not None]
        if not present:
            values[f.name] = None
        elif all(isinstance(g, int) for g in present):
            values[f.name] = statistics.median_low(present)
        else:
            values[f.name] = statistics.median(present)
    return Summary(**values)


def quantile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank quantile of an ascending list (0.0 for an empty one)."""
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def table(summaries: dict[str, Summary] | dict[str, dict[str, Any]]) -> str:
    """A Markdown table, one row per run (policy), the columns a reader compares first. A run is a Summary or
    its `to_dict()` (a published run); a figure a run lacks (None, or absent from a run transcribed from a
    page that did not show it) is "-", never a made-up number."""
    head = (
        "| run | requests | errors | TTFT p50 s | TTFT p90 s | TTFT p99 s | later turns TTFT p90 s | ITL p50 ms | "
        "e2e p90 s | out tok/s | cached | busiest/mean | lag p99 ms | prediction error tok | cost | "
        "saved by cache |"
    )
    rows = [head, "|" + "---|" * 16]
    for name, summary in summaries.items():
        s = summary.to_dict() if isinstance(summary, Summary) else summary
        share = s.get("saved_share_of_prompt_cost") or 0
        saved = _figure(s, "saved_by_cache", ".4g")
        cells = [
            name,
            _figure(s, "requests", "d"),
            _figure(s, "errors", "d"),
            *(_figure(s, key, ".3f") for key in ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "later_ttft_p90_s")),
            _figure(s, "itl_p50_s", ".1f", 1000),
            _figure(s, "e2e_p90_s", ".2f"),
            _figure(s, "output_tokens_per_s", ".0f"),
            _figure(s, "cached_ratio", ".3f"),
            f"{busiest:.2f}" if (busiest := s.get("busiest_over_mean")) else "-",  # 0: no replica named
            _figure(s, "lag_p99_s", ".1f", 1000),
            _figure(s, "prediction_error_tokens", ".1f"),
            _figure(s, "cost", ".4g"),
            saved if saved == "-" else f"{saved} ({100 * share:.1f} % of prompt cost)",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _figure(run: dict[str, Any], key: str, spec: str, scale: float = 1) -> str:
    value = run.get(key)
    return "-" if value is None else format(value * scale if scale != 1 else value, spec)


def busiest_over_mean(counts: Sequence[float]) -> float:
    """The busiest replica's share of the work over the mean share; 0.0 when there was none."""
    return max(counts) / statistics.fmean(counts) if sum(counts) else 0.0
