"""Kubernetes discovery: a pool's replicas are the endpoints of a Service's EndpointSlices, watched
through the API with lightkube, so a pod joins, leaves or flips readiness as soon as the API says so.

Usage (from `gateway.replicas.discovery.dns`, which imports this module only when a pool sets `discovery.kubernetes`):
    await watch_slices("llama", pool_config.discovery, apply, listed)   # runs until cancelled

Each pod (`targetRef.name`) is replica `<pod name>`, so ids survive restarts that change the pod's IP.
A slice's labels (copied from its Service) name its pool (`pool_label`), its pods' adapters
(`adapter_label_prefix`) and their role (`role_label`), as `gateway.config.kubernetes` describes.
The loop lists the slices the selector matches (`kubernetes.io/service-name=<service>`, `labels`, the
pool label), applies the whole set, then watches from the list's resourceVersion; every event
re-applies the set. A dropped watch resumes from
the last resourceVersion after a backoff (`retry_s`, doubling to 30s); 410 Gone (that version is
compacted away) relists after that pause, so a removal missed meanwhile still removes. A failing API keeps
the last set, like a DNS hiccup. Unready endpoints stay in the pool, marked unavailable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

import httpx2
import structlog
from lightkube import AsyncClient, KubeConfig
from lightkube.core.client import LabelSelector
from lightkube.core.exceptions import ApiError
from lightkube.core.exceptions import ConfigError as KubeConfigError
from lightkube.resources.discovery_v1 import EndpointSlice

from gateway.config.kubernetes import ROLES, KubernetesDiscoveryConfig, Role
from gateway.config.pools import DiscoveryConfig, ReplicaConfig
from gateway.replicas.discovery.discovered import Apply, discovered_replica
from gateway.support.backoff import Backoff

log = structlog.get_logger("gateway.replicas.discovery.kubernetes")

RETRY_MAX_S = 30.0


@dataclass(frozen=True, slots=True)
class PodEndpoint:
    """One endpoint of a slice: the pod it is, where it listens and whether it may take traffic."""

    pod: str
    address: str
    port: int
    ready: bool
    adapters: tuple[str, ...] = ()
    role: Role = "both"


def labelled(labels: dict[str, str], k8s: KubernetesDiscoveryConfig) -> tuple[tuple[str, ...], Role]:
    """The adapters and the role a slice's labels give its pods; an unknown role counts as `both`."""
    adapters: tuple[str, ...] = ()
    if (prefix := k8s.adapter_label_prefix) is not None:
        adapters = tuple(
            sorted(
                key[len(prefix) :]
                for key, value in labels.items()
                if key.startswith(prefix) and value.lower() == "true"
            )
        )
    role = labels.get(k8s.role_label, "both") if k8s.role_label is not None else "both"
    if role not in ROLES:
        log.warning("k8s_discovery_unknown_role", label=k8s.role_label, value=role, detail="taken as both")
        role = "both"
    return adapters, role  # type: ignore[return-value]  # checked against ROLES above


def _name(item: EndpointSlice) -> str:
    """The slice's name: the API always sets it (lightkube types every metadata field optional)."""
    return (item.metadata.name or "") if item.metadata else ""


def endpoints_of(
    item: EndpointSlice, spec: DiscoveryConfig, selector: dict[str, str] | None = None
) -> list[PodEndpoint]:
    """The slice's pod endpoints on the configured port; endpoints without a pod or that port are skipped,
    and so is a slice the selector does not match. `conditions.ready` unset means ready (the API's own rule)."""
    assert spec.kubernetes is not None
    if item.addressType not in ("IPv4", "IPv6"):  # FQDN endpoints name no pod address
        return []
    labels = dict(item.metadata.labels or {}) if item.metadata is not None else {}
    if selector is not None and not selector.items() <= labels.items():
        return []
    adapters, role = labelled(labels, spec.kubernetes)
    port = spec.port
    if spec.kubernetes.port_name is not None:
        named = [p.port for p in item.ports or () if p.name == spec.kubernetes.port_name and p.port]
        if not named:
            return []
        port = named[0]
    found = []
    for endpoint in item.endpoints or ():
        if endpoint.targetRef is None or not endpoint.targetRef.name or not endpoint.addresses:
            continue
        ready = endpoint.conditions is None or endpoint.conditions.ready is not False
        found.append(PodEndpoint(endpoint.targetRef.name, endpoint.addresses[0], port, ready, adapters, role))
    return found


def replica_configs(
    spec: DiscoveryConfig, endpoints: Iterable[PodEndpoint]
) -> tuple[list[ReplicaConfig], frozenset[str]]:
    """One replica per pod, named after it, and the pods not ready. A pod in two slices (a rollout
    moving it) counts once; ready wins."""
    pods: dict[str, PodEndpoint] = {}
    for endpoint in endpoints:
        if endpoint.pod not in pods or endpoint.ready:
            pods[endpoint.pod] = endpoint
    replicas = [
        discovered_replica(spec, pods[pod].address, pods[pod].port, pod, pods[pod].adapters, pods[pod].role)
        for pod in sorted(pods)
    ]
    return replicas, frozenset(pod for pod, endpoint in pods.items() if not endpoint.ready)


def kube_config(k8s: KubernetesDiscoveryConfig) -> KubeConfig:
    """The kubeconfig file when one is set, else the pod's service account (token and CA)."""
    if k8s.kubeconfig is not None:
        return KubeConfig.from_file(k8s.kubeconfig)
    return KubeConfig.from_service_account()


def _gone(exc: Exception) -> bool:
    """410 Gone: the resourceVersion we resume from is too old; only a fresh list is right."""
    if isinstance(exc, ApiError) and exc.status is not None and exc.status.code == 410:
        return True
    return isinstance(exc, httpx2.HTTPStatusError) and exc.response is not None and exc.response.status_code == 410


async def watch_slices(model: str, spec: DiscoveryConfig, apply: Apply, listed: asyncio.Event) -> None:
    """List, then watch, the Service's slices until cancelled; `listed` is set after the first attempt."""
    k8s = spec.kubernetes
    assert k8s is not None
    selector = k8s.selector(model)
    labels: LabelSelector = dict(selector)  # lightkube's wider value type
    slices: dict[str, list[PodEndpoint]] = {}
    version: str | None = None
    backoff = Backoff(k8s.retry_s, RETRY_MAX_S)
    client: AsyncClient | None = None

    async def publish() -> None:
        replicas, unready = replica_configs(spec, (e for found in slices.values() for e in found))
        await apply(model, replicas, unready)

    try:
        while True:
            try:
                client = client or AsyncClient(config=kube_config(k8s), namespace=k8s.namespace)
                if version is None:
                    listing = client.list(EndpointSlice, labels=labels)
                    slices = {_name(item): endpoints_of(item, spec, selector) async for item in listing}
                    version = listing.resourceVersion
                    await publish()
                    listed.set()
                    backoff.reset()
                    log.info("k8s_discovery_listed", model=model, source=spec.source, slices=len(slices))
                async for kind, item in client.watch(EndpointSlice, labels=labels, resource_version=version):
                    backoff.reset()
                    version = (item.metadata.resourceVersion if item.metadata else None) or version
                    if kind == "DELETED":
                        slices.pop(_name(item), None)
                    elif kind in ("ADDED", "MODIFIED"):
                        slices[_name(item)] = endpoints_of(item, spec, selector)
                    await publish()
            except (httpx2.HTTPError, OSError, KubeConfigError, KeyError) as exc:
                if _gone(exc):  # relist (after the usual pause: a list right after a list gains nothing)
                    log.info("k8s_discovery_relist", model=model, source=spec.source, version=version)
                    version = None
                else:
                    log.warning(
                        "k8s_discovery_failed",
                        model=model,
                        source=spec.source,
                        error=repr(exc),
                        retry_in_s=backoff.delay_s,
                    )
            except Exception:  # noqa: BLE001 - a discovery bug must not stop discovery
                log.exception("k8s_discovery_error", model=model, source=spec.source, retry_in_s=backoff.delay_s)
            listed.set()
            await asyncio.sleep(backoff.next_s())
    finally:
        if client is not None:
            await client.close()
