"""The collector's settings for a serving process.

Python's cyclic collector runs a young-generation pass every 700 net allocations and, every 100 of
those, a full pass over every tracked object. A proxied request allocates a few hundred objects
(aiohttp's request and response, headers, the gateway's records), so at thousands of requests a
second the collector ran hundreds of passes a second, and each full pass walked everything loaded at
start (config, metrics, routes, policies) again. `settle_heap` moves what start-up built out of the
collector's sight (`gc.freeze`: it lives as long as the process) and lets a young generation grow to
`YOUNG_THRESHOLD` objects first, as Instagram's and most large Python services' servers do. Objects
freed by their reference count, which is nearly all of a request's, are freed at once as before;
only cycles wait a little longer.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000  # allocations before a young pass (Python's default: 700)
OLDER_THRESHOLDS = (50, 100)  # young passes per middle pass, middle passes per full pass (default 10, 10)


def settle_heap() -> None:
    """Freeze what start-up built and space the collector's passes (call once the server is listening)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
