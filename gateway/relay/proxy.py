"""Forwarding and streaming relay: raw bytes in and out, one concern per layer.

    attempt       one upstream request up to its response headers (its retry loop: gateway.serving.attempts);
                  maps the send's failures once, a failure another replica may answer to `Retryable`;
                  sent by gateway.relay.upstream (the gateway's own HTTP/1.1 client)
    _relay        body back to the client: streams chunk by chunk as received (_relay_stream),
                  (or re-chunked in phrases, for a request that opted in: gateway.relay.phrase_chunking),
                  others in one piece (_relay_whole)

Retries happen only before the first byte reaches the client (connect errors, resets, 5xx, silence),
so a client never sees a stream restart.

Poison requests (a query of death): a failure the input may cause (a reset after the request was
sent, no first byte within `timeouts.first_byte_s`, a 5xx: `input_may_cause`) may be the input's
fault, not the replica's, so a retried one is charged to its replica's breaker only once the request
ends without a second one. A second replica failing the same request so, by any of these kinds,
marks the request as poison: no further replica is tried, no breaker is charged (two replicas
failing one input is evidence against the input; charging even the first would let a handful of
bad requests open every breaker of a small pool) and the client gets the second replica's 5xx as it
is, or a 502 / 504 saying the request failed on two replicas. A single such failure with no retry
left is charged as before: one answer cannot tell the input from the replica, and the breaker must
still see a broken replica. A refused or timed-out connect, or an ejected replica, is the replica's
alone: charged at once.

Silence: an attempt whose first byte does not come within `timeouts.first_byte_s`, or whose replica is
ejected by the health probes before it, is retried on another replica (nothing reached the client); a
stream silent for `timeouts.idle_s`, or whose replica is ejected, ends with the error event. At the end
of the shutdown grace period every stream still open ends the same way (`gateway.relay.watch`).

Client disconnect (handler cancellation, or a failed write) closes the upstream response at once,
which aborts the request at the replica; so does a streaming client that stops reading for
`limits.client_write_timeout_s`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import partial

import aiohttp
import structlog
from aiohttp import web
from multidict import CIMultiDict

from gateway.config.loader import Config
from gateway.errors import GatewayError, NoReplicaError, UpstreamError, UpstreamTimeoutError, error_body
from gateway.relay import headers as h
from gateway.relay.attempt import Attempt, Retryable, input_may_cause
from gateway.relay.phrase_chunking import PhraseChunker, relay_phrases
from gateway.relay.sse_framing import WholeEvents
from gateway.relay.sse_usage import SSEUsageScanner
from gateway.relay.upstream import Dropped, NoConnection, Upstream, UpstreamAnswer, UpstreamFailure
from gateway.relay.watch import Watch, Watches, read_whole
from gateway.replicas import Replica, ReplicaPool
from gateway.replicas.backend_auth import set_upstream_auth
from gateway.request.exchange import Exchange
from gateway.view import RequestView

log = structlog.get_logger("gateway.relay.proxy")

CLIENT_CLOSED = 499  # nginx's status for "client closed the request", used in logs and metrics only


class _SlowClient(Exception):
    """The client's socket stayed full past `limits.client_write_timeout_s`: it stopped reading."""


_HIGH_WATER = 1 << 16  # a transport pauses writers above this many queued bytes (asyncio's and uvloop's default)


async def _write(request: web.Request, response: web.StreamResponse, chunk: bytes, timeout_s: float) -> None:
    """Relay one chunk. A write can only block once more than the high-water mark is queued for the
    client, so only a client already behind (or a chunk that big) pays for a deadline; the common
    case costs one buffer-size check."""
    transport = request.transport
    if transport is None or not (transport.get_write_buffer_size() or len(chunk) > _HIGH_WATER):
        await response.write(chunk)
        return
    try:
        async with asyncio.timeout(timeout_s):
            await response.write(chunk)
    except TimeoutError:
        raise _SlowClient from None


class _Relayed(web.StreamResponse):
    """A stream relayed chunk by chunk: its headers leave with its first chunk, one send instead of two (as
    aiohttp's own web.Response does for a whole body). A stream chunked in phrases sends its headers at the
    first upstream byte instead, its first phrase may come later."""

    _send_headers_immediately = False


def _drop(request: web.Request) -> None:
    """Close the client connection at once: no chunked terminator follows (aiohttp's `write_eof` on a closed
    transport writes nothing)."""
    if request.transport is not None:
        request.transport.abort()


def _is_stream(upstream: UpstreamAnswer) -> bool:
    return upstream.content_type.startswith("text/event-stream")


def _cut(replica: Replica, watch: Watch) -> Exception:
    """The error for an attempt cut before any byte reached the client: retried elsewhere, unless the
    gateway is stopping."""
    if watch.kind == "shutdown":
        return NoReplicaError(watch.message, retry_after_s=1)
    return Retryable(UpstreamTimeoutError(f"replica {replica.replica_id}: {watch.message}"), watch.kind or "timeout")


def _broke_off(replica: Replica, failure: UpstreamFailure) -> Retryable:
    """The error for an answer whose body broke before any byte reached the client: retried like a reset."""
    return Retryable(UpstreamError(f"replica {replica.replica_id} broke off its answer: {failure}"), "reset")


class Proxy:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        on_upstream_error: Callable[[str, str], None],
        on_poison: Callable[[], None] | None = None,
    ) -> None:
        self._session = session
        self._upstream = Upstream()  # the attempts' send, on connections of its own
        self._on_upstream_error = on_upstream_error  # (replica_id, kind) → metrics
        self._on_poison = on_poison  # → affinity_gateway_poison_requests_total
        self.watches = Watches()  # every attempt in flight: cut on ejection and at the end of a drain

    async def close(self) -> None:
        """Close the kept-alive connections to replicas (at the app's end, once no request is in flight)."""
        await self._upstream.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        """The shared upstream session (also for the gateway's own small calls to replicas)."""
        return self._session

    async def attempt(
        self, request: web.Request, view: RequestView, attempt: Attempt, exchange: Exchange, config: Config
    ) -> web.StreamResponse:
        """Send the request to `attempt.replica` and relay its answer; raises `Retryable` while nothing has
        reached the client and another replica may answer."""
        sending = self._send_once(request, view, attempt, exchange, config)
        return await exchange.trace.attempt(attempt.replica.replica_id, attempt.replica.url, sending, exchange)

    def attempt_failed(self, attempt: Attempt, failure: Retryable, config: Config) -> bool:
        """Count a failed attempt's fault; True when its breaker charge waits for the request's end (a failure
        the input may cause, with a retry left: the request may yet prove poison, and then none is charged)."""
        if input_may_cause(failure.kind) and (not attempt.last or failure.kind.startswith("http_")):
            self._on_upstream_error(attempt.replica.replica_id, failure.kind)
            return True
        self._upstream_failed(attempt, failure.kind, failure.error.message, config)
        return False

    def poisoned(self, view: RequestView, replica: Replica, failure: Retryable, exchange: Exchange) -> GatewayError:
        """The second replica to fail this request as its input may cause (reset, silence): the request is
        poison, and the client's error says so (502, or 504 for silence)."""
        self._poisoned(view, replica, failure.kind, exchange)
        tried = ", ".join(exchange.failed_replicas)
        return type(failure.error)(
            f"the request failed on two replicas ({tried}; last: {failure.error.message}) "
            "and is not tried on another: the input itself may make replicas fail"
        )

    async def _send_once(
        self, request: web.Request, view: RequestView, attempt: Attempt, exchange: Exchange, config: Config
    ) -> web.StreamResponse:
        replica = attempt.replica
        out_headers = h.filtered(request.headers, h.REQUEST_DROP)
        out_headers[h.REQUEST_ID] = view.request_id
        exchange.trace.inject(out_headers)
        # the gateway's key is a credential for the gateway only
        set_upstream_auth(out_headers, config.backend_key(view.model, replica.replica_id), config.auth.enabled)
        watch = self.watches.start(replica.replica_id, config.timeouts.first_byte_s, config.timeouts.idle_s)
        try:
            try:
                async with watch.sending():
                    upstream = await self._upstream.send(
                        request.method, replica.url, request.path_qs, view.raw, out_headers, config.timeouts.connect_s
                    )
            except NoConnection as exc:  # the request never left
                message = (
                    f"connect to replica {replica.replica_id} timed out"
                    if exc.timed_out
                    else f"replica {replica.replica_id} failed: {exc}"
                )
                raise Retryable(UpstreamError(message), "connect") from exc
            except TimeoutError as exc:
                raise _cut(replica, watch) from exc
            except Dropped as exc:  # sent, then dropped (reset, closed) before an answer
                raise Retryable(UpstreamError(f"replica {replica.replica_id} failed: {exc}"), "reset") from exc
            watch.answered(upstream, first_byte=not _is_stream(upstream))
            try:
                if upstream.status >= 500 and attempt.after_fault:
                    self._poisoned(view, replica, f"http_{upstream.status}", exchange)
                elif upstream.status >= 500 and not attempt.last:
                    raise Retryable(
                        UpstreamError(f"replica {replica.replica_id} answered {upstream.status}"),
                        f"http_{upstream.status}",
                    )
                elif upstream.status >= 500:
                    self._upstream_failed(attempt, f"http_{upstream.status}", f"status {upstream.status}", config)
                else:
                    replica.request_succeeded()
                return await self._relay(request, view, upstream, attempt, exchange, config, watch)
            except BaseException:
                upstream.close()  # cancellation included: drop the connection so the replica aborts the request
                raise
            finally:
                upstream.release()
        finally:
            self.watches.end(watch)

    async def _relay(
        self,
        request: web.Request,
        view: RequestView,
        upstream: UpstreamAnswer,
        attempt: Attempt,
        exchange: Exchange,
        config: Config,
        watch: Watch,
    ) -> web.StreamResponse:
        replica, decision = attempt.replica, attempt.decision
        exchange.status = upstream.status
        back = h.passed_on(upstream.raw_headers, h.response_drop(config.headers))
        back[h.REQUEST_ID] = view.request_id
        if config.headers.replica_id:
            back[h.REPLICA_ID] = replica.replica_id
        if config.headers.affinity_reason:
            back[h.ROUTE_REASON] = decision.reason
        if config.pools[view.model].routing.explain_header:
            back[h.ROUTE_EXPLAIN] = decision.header_value()
        if _is_stream(upstream):
            return await self._relay_stream(request, upstream, back, attempt, exchange, config, watch)
        return await self._relay_whole(upstream, back, replica, exchange, config, watch)

    async def _relay_whole(
        self,
        upstream: UpstreamAnswer,
        back: CIMultiDict[str],
        replica: Replica,
        exchange: Exchange,
        config: Config,
        watch: Watch,
    ) -> web.StreamResponse:
        """A non-streamed answer: nothing has reached the client yet, so a broken or cut body is retried like
        a reset before the headers. It is held whole, so it is bounded by `limits.max_answer_bytes`: a larger
        one (said by its Content-Length, or found on the way) is dropped with a 502, not retried (another
        replica would write as much), and memory holds at most the limit's pieces and their join."""
        exchange.first_byte(replica.replica_id)
        most = config.limits.max_answer_bytes
        try:
            body = await read_whole(upstream, most, watch)
        except UpstreamFailure as exc:
            if watch.kind is not None:
                raise _cut(replica, watch) from exc
            raise _broke_off(replica, exc) from exc
        if body is None:
            raise UpstreamError(f"replica {replica.replica_id}'s answer is over limits.max_answer_bytes ({most})")
        exchange.usage.read_body(body)
        return web.Response(status=upstream.status, reason=upstream.reason, body=body, headers=back)

    async def _relay_stream(
        self,
        request: web.Request,
        upstream: UpstreamAnswer,
        back: CIMultiDict[str],
        attempt: Attempt,
        exchange: Exchange,
        config: Config,
        watch: Watch,
    ) -> web.StreamResponse:
        """Each chunk is written as it arrives, in whole events (`WholeEvents`: a break leaves no half event
        before the error event); usage is scanned after the writes, never delaying one. A stream the request
        asked to be chunked in phrases goes through `relay_phrases` instead."""
        replica = attempt.replica
        exchange.streamed = True
        phrases = PhraseChunker(exchange.chunking) if exchange.chunking is not None else None
        response = (web.StreamResponse if phrases is not None else _Relayed)(
            status=upstream.status, reason=upstream.reason, headers=back
        )
        scanner = SSEUsageScanner(exchange.usage)
        events = WholeEvents(
            partial(_write, request, response, timeout_s=config.limits.client_write_timeout_s),
            drop_usage=exchange.strip_usage,
        )  # and drops the usage event we asked for
        try:
            if phrases is None:
                while chunk := await upstream.read_any():
                    watch.touch()
                    if exchange.ttft_s is None:
                        exchange.first_byte(replica.replica_id)
                        await response.prepare(request)
                    await events.write(chunk)
                    scanner.feed(chunk)
            else:

                async def seen(chunk: bytes) -> None:  # upstream bytes: watched and scanned, not written
                    watch.touch()
                    if exchange.ttft_s is None:
                        exchange.first_byte(replica.replica_id)
                        await response.prepare(request)
                    scanner.feed(chunk)

                await relay_phrases(upstream, phrases, seen, events.write, exchange.phrase_written)
            await events.finish()
            if not response.prepared:
                await response.prepare(request)
        except ConnectionResetError:  # the client went away; aiohttp ignores the failed write_eof
            exchange.status, exchange.error = CLIENT_CLOSED, "client disconnected"
            upstream.close()
        except _SlowClient:
            exchange.status, exchange.error = CLIENT_CLOSED, "client stopped reading"
            upstream.close()
            _drop(request)  # drop what it never read; a graceful close would wait for it
        except UpstreamFailure as exc:
            if not response.prepared and watch.kind != "shutdown":  # nothing reached the client
                raise (_cut(replica, watch) if watch.kind is not None else _broke_off(replica, exc)) from exc
            exchange.error = watch.message or f"upstream broke mid-stream: {exc}"
            if watch.kind != "shutdown":
                self._upstream_failed(attempt, watch.kind or "mid_stream", exchange.error, config)
            events.cut()
            await self._end_stream_with_error(
                request, response, exchange.error, events.framed and (phrases is None or phrases.framed)
            )
        finally:
            scanner.flush()  # the usage of what was relayed, however the stream ended
        return response

    async def _end_stream_with_error(
        self, request: web.Request, response: web.StreamResponse, message: str, at_event_boundary: bool
    ) -> None:
        """vLLM's own mid-stream error form: an error event then [DONE]. Where it cannot be framed cleanly
        (half an event already went out), the connection is closed without the chunked terminator: the
        client sees a broken answer, never a complete one."""
        if not response.prepared:
            await response.prepare(request)
        if at_event_boundary:
            await response.write(b"data: " + error_body(message, "BadGatewayError", 502) + b"\n\ndata: [DONE]\n\n")
        else:
            _drop(request)

    def _poisoned(self, view: RequestView, replica: Replica, kind: str, exchange: Exchange) -> None:
        """The second replica to fail this request as its input may cause (a 5xx answer goes to the client
        as it is): counted, logged, and no breaker is charged for any of its attempts."""
        exchange.poison = True
        self._on_upstream_error(replica.replica_id, kind)
        if self._on_poison is not None:
            self._on_poison()
        tried = [*exchange.failed_replicas]
        log.warning(
            "poison_request",
            request_id=view.request_id,
            kind=kind,
            replicas=tried if replica.replica_id in tried else [*tried, replica.replica_id],
        )

    def _upstream_failed(self, attempt: Attempt, kind: str, error: str, config: Config) -> None:
        self._on_upstream_error(attempt.replica.replica_id, kind)
        self.charge(attempt.pool, attempt.replica, kind, error, config)

    def charge(self, pool: ReplicaPool, replica: Replica, kind: str, error: str, config: Config) -> None:
        """Count a fault against the replica's breaker, within the pool's ejection cap (metrics are counted
        where the fault is seen)."""
        verdict = pool.fault(replica, config.health, error)
        if verdict == "opened":
            log.warning(
                "breaker_opened",
                replica=replica.replica_id,
                kind=kind,
                error=error,
                backoff_s=round(replica.breaker.open_until - time.monotonic(), 3),
            )
        elif verdict == "held":
            log.warning(
                "breaker_held",
                replica=replica.replica_id,
                kind=kind,
                error=error,
                reason=f"the pool is at health.max_ejection_percent ({config.health.max_ejection_percent})",
            )
