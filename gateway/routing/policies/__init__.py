"""Routing policies: the interface (`base`: candidates in, a scored decision out), one module per
policy, the cost model prefix_affinity predicts with (`cost`), and the table from YAML `type` to policy
class (`registry`: `build_policy`). Imports config, request, support and the top-level modules only."""

from __future__ import annotations

from gateway.routing.policies.base import Policy

__all__ = ["Policy"]
