"""The process's file-descriptor limit: raised at start, and a warning before it runs out.

Every client connection, upstream connection, Redis and ZMQ socket is a file descriptor; at the soft
`RLIMIT_NOFILE` (1,024 by default on many systems) `accept()` and `connect()` fail with EMFILE and
requests are reset. A proxy needs two per request in flight, so `raise_limit` lifts the soft limit to
the hard one at start (as nginx's `worker_rlimit_nofile` and Go's runtime do; the hard limit is the
operator's, `ulimit -Hn`, `LimitNOFILE=`, the container's nofile) and logs `fd_limit_raised`. `FdWatch.check`
is sampled on the health monitor's tick, never per request: it counts `/proc/self/fd` (Linux; elsewhere
it does nothing) and logs `fd_limit_near` once when the share in use crosses `WARN_SHARE`, and
`fd_limit_ok` once it is back under `CLEAR_SHARE` (a hysteresis: no warning per tick while it hovers).
"""

from __future__ import annotations

import os
import resource

import structlog

log = structlog.get_logger("gateway.fd_limit")

WARN_SHARE = 0.8
CLEAR_SHARE = 0.7
MOST = 1 << 20  # the soft limit asked for when the hard one is unlimited (Linux's default nr_open)
_FD_DIR = "/proc/self/fd"


def raise_limit() -> int:
    """Lift the soft RLIMIT_NOFILE to the hard limit; the soft limit now (unchanged where it cannot be raised)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = MOST if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):
            return soft
        log.info("fd_limit_raised", soft_was=soft, soft=wanted, hard=hard)
        return wanted
    return soft


class FdWatch:
    """Open descriptors against the soft limit, read at each `check`."""

    def __init__(self) -> None:
        self.near = False
        self.available = os.path.isdir(_FD_DIR)

    def check(self) -> int | None:
        """The number of open descriptors (None where it cannot be counted); logs on crossing a share."""
        if not self.available:
            return None
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        used = len(os.listdir(_FD_DIR)) - 1  # listdir's own descriptor
        if soft == resource.RLIM_INFINITY or soft <= 0:
            return used
        share = used / soft
        if not self.near and share >= WARN_SHARE:
            self.near = True
            log.warning(
                "fd_limit_near",
                open_fds=used,
                limit=soft,
                detail="the process nears its file-descriptor limit: new connections will fail (EMFILE); "
                "raise it (ulimit -n, LimitNOFILE=, the container's nofile) or lower the connection load",
            )
        elif self.near and share < CLEAR_SHARE:
            self.near = False
            log.info("fd_limit_ok", open_fds=used, limit=soft)
        return used
