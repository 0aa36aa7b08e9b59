"""What a pool's router learns of its replicas as they answer: their KV block size, each one's cache
capacity (which bounds its warm-prefix table), and how many of the replica's tokens a character-key
estimate is worth. Routing reads these; only the replicas' reports change them."""

from __future__ import annotations

import structlog

from gateway.config.pools import PrefixConfig
from gateway.index import WarmIndex
from gateway.index.exact import ExactTables
from gateway.observability.routing_metrics import RoutingMetrics
from gateway.view import RequestView

log = structlog.get_logger("gateway.routing.calibration")


class Calibration:
    def __init__(
        self,
        prefix_params: PrefixConfig,
        index: WarmIndex,
        exact: ExactTables | None,
        metrics: RoutingMetrics | None,
        pool: str,
    ) -> None:
        self.prefix_params = prefix_params
        self.index = index
        self.exact = exact
        self.metrics = metrics
        self.pool = pool
        # Replica tokens per estimated token of character keys, learned from the replicas' usage
        # (chars_per_token is a guess: 4 for English BPE, other for other tokenizers and languages).
        self.token_ratio = 1.0
        self._ratio_samples = 0
        self._applied_ratio = 1.0
        self._kv_tokens: dict[str, int] = {}  # each replica's KV capacity in tokens (cache_config_info)
        self._configured_block = prefix_params.block_tokens  # None: learn it from the replicas
        self._mismatched: set[str] = set()  # replicas whose block size differs from the configured one (logged)

    def set_capacity(self, replica_id: str, kv_tokens: int) -> None:
        """The replica's KV cache holds `kv_tokens`: bound its warm-prefix table to as many blocks."""
        self._kv_tokens[replica_id] = kv_tokens
        self.index.set_capacity(replica_id, self._index_blocks(kv_tokens))

    def block_size_seen(self, replica_id: str, block_size: int, source: str) -> None:
        """A replica told its KV block size. Unset in the config: adopt it (the first one seen; a
        pool mixing block sizes needs the setting). Set and different: log once, export the gauge."""
        if self._configured_block is None:
            if self.prefix_params.block_tokens is None:
                self.prefix_params = self.prefix_params.model_copy(update={"block_tokens": block_size})
                if self.exact is not None:
                    self.exact.block_tokens = block_size
                log.info(
                    "block_tokens_learned", pool=self.pool, replica=replica_id, block_tokens=block_size, source=source
                )
            return
        mismatched = block_size != self._configured_block
        if mismatched and replica_id not in self._mismatched:
            log.warning(
                "block_tokens_mismatch",
                pool=self.pool,
                replica=replica_id,
                replica_block_size=block_size,
                configured_block_tokens=self._configured_block,
                source=source,
                detail="token keys never match this replica's blocks; set routing.prefix.block_tokens "
                f"to {block_size} or leave it unset to learn it",
            )
        (self._mismatched.add if mismatched else self._mismatched.discard)(replica_id)
        if self.metrics is not None:
            self.metrics.block_tokens_mismatch.labels(self.pool, replica_id).set(block_size if mismatched else 0)

    def _index_blocks(self, kv_tokens: int) -> int:
        return max(1, int(kv_tokens / (self.prefix_params.tokens_per_block * self.token_ratio)))

    def learn_ratio(self, view: RequestView, prompt_tokens: int) -> None:
        """Character keys estimate tokens from characters; the replica counts them. Follow the ratio
        (a running mean, then an EWMA), and resize the tables when it moved: with a wrong ratio the
        index forgets (or keeps) prefixes the replica still holds (or has evicted)."""
        estimate = view.prompt_tokens_estimate / self.token_ratio_of(view)
        if estimate < 16:
            return
        self._ratio_samples += 1
        sample = min(max(prompt_tokens / estimate, 0.2), 5.0)
        self.token_ratio += max(0.05, 1 / self._ratio_samples) * (sample - self.token_ratio)
        if abs(self.token_ratio / self._applied_ratio - 1) > 0.02:
            self._applied_ratio = self.token_ratio
            for replica_id, kv_tokens in list(self._kv_tokens.items()):
                self.set_capacity(replica_id, kv_tokens)

    def token_ratio_of(self, view: RequestView) -> float:
        """The ratio the view's character-key estimate was scaled by."""
        return view.tokens_per_block / self.prefix_params.tokens_per_block
