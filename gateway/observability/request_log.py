"""The request log: one structlog event per finished request (`logging.requests`), one per retried
attempt. The prompt's text is added only with `logging.prompts`, never by default."""

from __future__ import annotations

from gateway.log import HotLogger
from gateway.request.exchange import Exchange, FinishedRequest
from gateway.request.observers import RequestObserver
from gateway.request.timing import rounded

request_log = HotLogger("gateway.request")


class RequestLog(RequestObserver):
    def attempt_failed(self, exchange: Exchange, replica_id: str, kind: str, error: str) -> None:
        request_log.info(
            "upstream_retry", request_id=exchange.view.request_id, replica=replica_id, kind=kind, error=error
        )

    def finished(self, done: FinishedRequest) -> None:
        logging = done.config.logging
        if not logging.requests:
            return
        view, usage, timing, decision = done.view, done.usage, done.timing, done.decision
        fields = {
            "request_id": view.request_id,
            "model": view.model,
            "adapter": view.adapter,
            "endpoint": view.endpoint,
            "stream": view.stream,
            "replica": done.replica_id,
            "policy": done.routing.policy,
            "reason": decision.reason if decision else None,
            "status": done.status,
            "queue_s": rounded(timing.queue_s),
            "ttft_s": rounded(timing.ttft_s),
            "first_phrase_s": rounded(done.first_phrase_s),
            "total_s": rounded(timing.total_s),
            "tokens_per_s": rounded(timing.tokens_per_s),
            "itl_s": rounded(timing.itl_s),
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "cached_tokens": usage.cached_tokens,
            "retried_from": list(done.failed_replicas) or None,
            "error": done.error,
            "decision": decision.candidates() if decision else None,
            "tenant": view.tenant,
        }
        if logging.prompts:
            fields["prompt"] = view.body.get("messages", view.body.get("prompt"))
        request_log.event("request", fields)
