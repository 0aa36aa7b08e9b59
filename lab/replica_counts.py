"""How many requests each replica of a bench run served, counted by the replicas themselves.

An answer names the replica that served it only where the router or the replica says so (our gateway's
`X-Replica-Id`, the replica stub's own answers). In front of real vLLM a peer router's answers name none,
so the load share of its runs was unknown ("-" in the busiest/mean column), and a router that piled its
work on one replica could not be told from one that spread it. vLLM counts the requests it finished
(`vllm:request_success_total`, which the gateway's load scrape reads too: `gateway.replicas.load`); read
before and after a run, the difference is each replica's share, whichever router sent them.
"""

from __future__ import annotations

import httpx

from gateway.replicas.load import parse_metrics


def finished(urls: list[str]) -> list[float] | None:
    """Each replica's finished requests so far, in `urls` order; None when one cannot be read."""
    counts = []
    for url in urls:
        try:
            response = httpx.get(f"{url}/metrics", timeout=10)
        except httpx.HTTPError:
            return None
        done = parse_metrics(response.text).completed if response.status_code == 200 else None
        if done is None:
            return None
        counts.append(done)
    return counts


def served(names: list[str], before: list[float] | None, after: list[float] | None) -> dict[str, int] | None:
    """Requests each replica finished between the two reads, by replica name; None without both reads."""
    if before is None or after is None:
        return None
    return {name: round(end - start) for name, start, end in zip(names, before, after, strict=True)}
