"""`affinity-gateway prefix-report URL`: a running gateway's prompt-prefix hygiene report as a table.

affinity-gateway prefix-report http://localhost:8000 [--admin-key KEY]   (or env AFFINITY_GATEWAY_ADMIN_KEY)
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request
from typing import Any

import orjson

from gateway.config.loader import ENV_PREFIX

_COLUMNS = (
    "tenant",
    "model",
    "family",
    "affected",
    "block",
    "token offset",
    "recoverable tokens",
    "lost tokens",
    "lost prefill s",
    "lost cost",
)


def add_prefix_report(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = commands.add_parser("prefix-report", help="which prompt families diverge early and what cache that loses")
    p.add_argument("url", help="the gateway's base URL, e.g. http://localhost:8000")
    p.add_argument(
        "--admin-key",
        default=os.environ.get(ENV_PREFIX + "ADMIN_KEY"),
        help=f"an admin API key, when auth is on (env {ENV_PREFIX}ADMIN_KEY)",
    )
    p.set_defaults(run=_prefix_report)


def _prefix_report(args: argparse.Namespace) -> int:
    headers = {"Authorization": f"Bearer {args.admin_key}"} if args.admin_key else {}
    asked = urllib.request.Request(args.url.rstrip("/") + "/admin/prefix-report", headers=headers)
    try:  # the standard library's client: httpx is the tests' only (a plain install has none)
        with urllib.request.urlopen(asked, timeout=10) as answer:
            body = answer.read()
    except urllib.error.HTTPError as exc:
        print(f"affinity-gateway: {exc.code} from {args.url}: {exc.read().decode(errors='replace')}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"affinity-gateway: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1
    print(table(orjson.loads(body)))
    return 0


def table(report: dict[str, Any]) -> str:
    """The report's families as aligned columns, the most lost tokens first; a line when there are none."""
    rows = [
        [
            f["tenant"],
            f["model"],
            f["family"],
            f"{f['affected_requests']}/{f['requests_seen']}",
            str(f["divergence"]["block"]),
            str(f["divergence"]["token_offset"]),
            str(f["recoverable_tokens"]),
            str(f["lost"]["tokens"]),
            f"{f['lost']['prefill_s']:.3f}",
            "-" if f["lost"]["cost"] is None else f"{f['lost']['cost']:.6f}",
        ]
        for f in report["families"]
    ]
    summary = (
        f"{report['analysed_requests']} requests analysed, {report['skipped_requests']} skipped; "
        f"families sharing at least {report['min_tokens']} tokens after an early divergence"
    )
    if not rows:
        return f"{summary}: none"
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(_COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(_COLUMNS, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows]
    lines += [
        f"  {f['tenant']}/{f['family']} around the divergence: {f['around']!r}"
        for f in report["families"]
        if "around" in f
    ]
    return "\n".join([f"{summary}:", *lines])
