"""Who sent a request: the API key it was authenticated with (`gateway.edge.auth` finds it), or no one
when auth is off. Rate limits, tenant metrics and costs are counted by it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.support.records import record

if TYPE_CHECKING:
    from gateway.config.features import ApiKeyConfig


@record
class Caller:
    """The authenticated caller of one request (`key` None when auth is off)."""

    key: ApiKeyConfig | None = None

    @property
    def tenant(self) -> str | None:
        return self.key.tenant if self.key else None


ANONYMOUS = Caller()
