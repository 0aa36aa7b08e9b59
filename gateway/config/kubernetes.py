"""YAML `pools.<model>.discovery.kubernetes`: which EndpointSlices feed a pool, and how their labels map
to the pool, its adapters and each replica's role. Kept apart from `gateway.config.pools` (which imports it)
so each config module stays about one group of sections; no Kubernetes client is imported here.

    discovery:
      kubernetes:
        labels: {app.kubernetes.io/part-of: llm}          # one selector over many Services
        pool_label: affinity-gateway.io/pool             # its value names the pool (default: the pool's name)
        adapter_label_prefix: adapters.affinity-gateway.io/  # a label adapters.affinity-gateway.io/sql-lora: "true"
        role_label: affinity-gateway.io/role             # prefill | decode | both (unset: both)

Kubernetes copies a Service's labels onto its EndpointSlices, so these labels go on the Service: one
Service per set of pods that share a pool, adapters and role. Routing ignores the role for now.
"""

from __future__ import annotations

import importlib.util
import re
from typing import Literal

from pydantic import Field

from gateway.config.schema import Section
from gateway.errors import ConfigError, join_key

Role = Literal["prefill", "decode", "both"]
ROLES: tuple[Role, ...] = ("prefill", "decode", "both")

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"  # a label key's name part, and a label value
_LABEL_VALUE = re.compile(rf"({_NAME})?")
_SUBDOMAIN = r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?"
_LABEL_KEY = re.compile(rf"({_SUBDOMAIN}/)?{_NAME}")
_PREFIX = re.compile(rf"{_SUBDOMAIN}/")


def is_label_value(text: str) -> bool:
    """Whether `text` may be a label's value (at most 63 of A-Z a-z 0-9 - _ ., alphanumeric at both ends)."""
    return bool(_LABEL_VALUE.fullmatch(text))


class KubernetesDiscoveryConfig(Section):
    """The endpoints of the EndpointSlices selected by `service` and `labels`, watched through the API
    (`gateway.replicas.discovery.kubernetes`); each pod's name is its replica id."""

    service: str | None = None  # slices labelled kubernetes.io/service-name=<this>
    namespace: str | None = None  # default: the service account's (or the kubeconfig context's) namespace
    port_name: str | None = None  # the slices' port of this name; default: `discovery.port`
    labels: dict[str, str] = Field(default_factory=dict)  # more label terms the slices must carry
    kubeconfig: str | None = None  # a kubeconfig file (running outside the cluster); default: in-cluster
    retry_s: float = 1.0  # first reconnect delay after a watch error, doubling up to 30s
    pool_label: str | None = None  # only slices whose label of this key is `pool_value` join the pool
    pool_value: str | None = None  # default: the pool's name (when it is a valid label value)
    adapter_label_prefix: str | None = None  # labels `<prefix><adapter>: "true"` name adapters of the slice's pods
    role_label: str | None = None  # its value (prefill, decode, both) is the role of the slice's pods

    def selector(self, pool: str) -> dict[str, str]:
        """The label selector of this pool's slices."""
        terms = dict(self.labels)
        if self.pool_label is not None:
            terms[self.pool_label] = self.pool_value or pool
        if self.service is not None:
            terms["kubernetes.io/service-name"] = self.service
        return terms

    def check(self) -> None:
        for name in ("service", "namespace", "port_name"):
            value = getattr(self, name)
            if value is not None and not _DNS_LABEL.fullmatch(value):
                raise ConfigError(f"expected a Kubernetes name like vllm, got {value!r}", key=name)
        if self.service is None and not self.labels and self.pool_label is None:
            raise ConfigError(
                "set `service`, `labels` or `pool_label`: an empty selector would take every "
                "EndpointSlice of the namespace",
                key="service",
            )
        for label, value in self.labels.items():
            if not _LABEL_KEY.fullmatch(label):
                raise ConfigError(f"expected a label key like app.kubernetes.io/name, got {label!r}", key="labels")
            if not is_label_value(str(value)):
                raise ConfigError(f"expected a label value, got {value!r}", key=f"labels.{label}")
        for name in ("pool_label", "role_label"):
            value = getattr(self, name)
            if value is not None and not _LABEL_KEY.fullmatch(value):
                raise ConfigError(f"expected a label key like affinity-gateway.io/pool, got {value!r}", key=name)
        if self.pool_value is not None:
            if self.pool_label is None:
                raise ConfigError("a pool_value needs pool_label", key="pool_value")
            if not is_label_value(self.pool_value):
                raise ConfigError(
                    f"expected a label value (63 of A-Z a-z 0-9 - _ .), got {self.pool_value!r}",
                    key="pool_value",
                )
        if self.adapter_label_prefix is not None and not _PREFIX.fullmatch(self.adapter_label_prefix):
            raise ConfigError(
                "expected a label key prefix ending in '/', like adapters.affinity-gateway.io/, "
                f"got {self.adapter_label_prefix!r}",
                key="adapter_label_prefix",
            )
        if self.retry_s <= 0:
            raise ConfigError(f"must be > 0, got {self.retry_s}", key="retry_s")
        if importlib.util.find_spec("lightkube") is None:  # found now, not when the watch task starts
            raise ConfigError("needs the Kubernetes client: pip install 'affinity-gateway[k8s]'")

    def check_pool(self, pool: str, key: str) -> None:
        """The pool's name is the label value to select unless `pool_value` says otherwise."""
        if self.pool_label is not None and self.pool_value is None and not is_label_value(pool):
            raise ConfigError(
                f"the pool's name {pool!r} cannot be a label value: set pool_value", key=join_key(key, "pool_value")
            )
