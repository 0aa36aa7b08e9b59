"""Routing policies: the interface (`base`: candidates in, a scored decision out), one module per
policy, and the table from YAML `type` to policy class (`registry`: `build_policy`)."""

from __future__ import annotations

from gateway.routing.policies.base import Policy

__all__ = ["Policy"]
