"""Where one request's time went: queue, time to first token, decode, and the decode speed.

Decode speed comes from the request's own totals, not from timing every chunk: decode time is the
stream's time after its first byte, tokens per second is completion tokens over it, and inter-token
latency is it over the gaps between tokens (completion − 1). A whole (non-streamed) answer's first
byte comes after its last token, so it has no prefill or decode time of its own and no speeds.
"""

from __future__ import annotations

from gateway.support.records import record


@record
class Timing:
    queue_s: float  # waiting for a replica slot (admission) and deciding, summed over attempts
    ttft_s: float | None
    total_s: float  # time to complete: gateway in to out
    decode_s: float | None = None
    tokens_per_s: float | None = None
    itl_s: float | None = None  # mean inter-token latency

    @classmethod
    def of(
        cls, queue_s: float, ttft_s: float | None, total_s: float, streamed: bool, completion_tokens: int | None
    ) -> Timing:
        if not streamed or ttft_s is None:
            return cls(queue_s, ttft_s, total_s)
        decode_s = max(total_s - ttft_s, 0.0)
        tokens = completion_tokens or 0
        return cls(
            queue_s,
            ttft_s,
            total_s,
            decode_s,
            tokens / decode_s if tokens and decode_s > 0 else None,
            decode_s / (tokens - 1) if tokens > 1 else None,
        )

    @property
    def prefill_s(self) -> float | None:
        """From dispatch to a stream's first token: the replica's prefill (and its own queue, and the network);
        None for a whole answer, whose first byte comes after its decode too."""
        if self.decode_s is None or self.ttft_s is None:
            return None
        return max(self.ttft_s - self.queue_s, 0.0)


_EXACT = float(1 << 52)  # from here on every float is a whole number: nothing to round


def micro(value: float) -> float:
    """`value` to six decimals, as `round(value, 6)` gives it but for a tie in the seventh (scaled, rounded to
    a whole number, scaled back): `round(value, 6)` finds the exact decimal through a string conversion, several
    times the cost, and a request's log line rounds a dozen values. Infinite and NaN values stay as they are."""
    scaled = value * 1_000_000
    return round(scaled) / 1_000_000 if -_EXACT < scaled < _EXACT else value


def rounded(value: float | None) -> float | None:
    """Seconds as logged and answered: to the microsecond, None kept."""
    return None if value is None else micro(value)
