"""A stand-in for the Kubernetes API server's EndpointSlice list and watch, on a loopback port.

No cluster can run on these machines, so the discovery tests talk to this instead: it answers
`GET .../endpointslices` (a list with its resourceVersion) and `...?watch=true&resourceVersion=N`
(newline-delimited JSON events after N, then new ones as the test makes them), the shape the real
API server uses. A `labelSelector` of equality terms filters both, as there: a slice relabelled out
of a watch's selector reaches that watch as DELETED. `drop_watches` cuts open watch streams
mid-response; `compact` makes older versions 410 Gone, as etcd compaction does.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

PATH = "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"


def endpoint_slice(
    name: str,
    service: str,
    pods: dict[str, tuple[str, bool]],
    port: int,
    port_name: str = "http",
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """An EndpointSlice as the API serves it: `pods` maps pod name -> (IP, ready); `labels` are the
    Service's, which Kubernetes copies onto its slices."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "addressType": "IPv4",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {**(labels or {}), "kubernetes.io/service-name": service},
        },
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
        "endpoints": [
            {
                "addresses": [ip],
                "conditions": {"ready": ready, "serving": ready, "terminating": False},
                "targetRef": {"kind": "Pod", "name": pod, "namespace": "default"},
            }
            for pod, (ip, ready) in pods.items()
        ],
    }


def matches(selector: str, item: dict[str, Any]) -> bool:
    """Whether the slice carries every `key=value` term of a label selector."""
    labels = item["metadata"].get("labels") or {}
    terms = [term.split("=", 1) for term in selector.split(",") if term]
    return all(labels.get(key) == value for key, value in terms)


class FakeSliceAPI:
    """The slices of one namespace, their history of events, and the open watches."""

    def __init__(self) -> None:
        self.version = 100
        self.slices: dict[str, dict[str, Any]] = {}
        self.events: list[tuple[int, str, dict[str, Any]]] = []
        self.compacted = 0  # watches from a version below this get 410 Gone
        self.requests: list[dict[str, str]] = []  # query of every list and watch, in order
        self._changed = asyncio.Condition()
        self._drops = 0
        app = web.Application()
        app.router.add_get(PATH, self._handle)
        self.server = TestServer(app, host="127.0.0.1")

    async def __aenter__(self) -> FakeSliceAPI:
        await self.server.start_server()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    def kubeconfig(self) -> str:
        """A kubeconfig (YAML is a superset of JSON) pointing at this server."""
        return json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "fake",
                "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                "users": [{"name": "fake", "user": {"token": "test"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": "default"}}],
            }
        )

    async def put(self, item: dict[str, Any]) -> None:
        """Create or replace a slice: ADDED or MODIFIED."""
        kind = "MODIFIED" if item["metadata"]["name"] in self.slices else "ADDED"
        await self._record(kind, item)

    async def delete(self, name: str) -> None:
        await self._record("DELETED", self.slices[name])

    async def drop_watches(self) -> None:
        """Cut every open watch stream without ending it cleanly (a broken connection)."""
        async with self._changed:
            self._drops += 1
            self._changed.notify_all()

    async def _record(self, kind: str, item: dict[str, Any]) -> None:
        async with self._changed:
            self.version += 1
            item = {**item, "metadata": {**item["metadata"], "resourceVersion": str(self.version)}}
            if kind == "DELETED":
                del self.slices[item["metadata"]["name"]]
            else:
                self.slices[item["metadata"]["name"]] = item
            self.events.append((self.version, kind, item))
            self._changed.notify_all()

    @staticmethod
    def _follow(shown: set[str], kind: str, item: dict[str, Any], selector: str) -> None:
        name = item["metadata"]["name"]
        if kind == "DELETED" or not matches(selector, item):
            shown.discard(name)
        else:
            shown.add(name)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(dict(request.query))
        selector = request.query.get("labelSelector", "")
        if request.query.get("watch") != "true":
            return web.json_response(
                {
                    "apiVersion": "discovery.k8s.io/v1",
                    "kind": "EndpointSliceList",
                    "metadata": {"resourceVersion": str(self.version)},
                    "items": [i for i in self.slices.values() if matches(selector, i)],
                }
            )
        since = int(request.query.get("resourceVersion") or self.version)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        if since < self.compacted:
            gone = {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": "Expired",
                "code": 410,
                "message": f"too old resource version: {since} ({self.compacted})",
            }
            await response.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
            return response
        drops = self._drops
        shown: set[str] = set()  # the matching slices as of `since`
        for version, kind, item in self.events:
            if version <= since:
                self._follow(shown, kind, item, selector)
        while True:
            for version, kind, item in [e for e in self.events if e[0] > since]:
                since, name = version, item["metadata"]["name"]
                if not matches(selector, item):
                    if name not in shown:
                        continue
                    kind = "DELETED"  # relabelled out of the selector
                self._follow(shown, kind, item, selector)
                await response.write(json.dumps({"type": kind, "object": item}).encode() + b"\n")
            async with self._changed:

                def changed(since: int = since, drops: int = drops) -> bool:
                    return self._drops != drops or bool(self.events) and self.events[-1][0] > since

                await self._changed.wait_for(changed)
            if self._drops != drops:
                assert request.transport is not None
                request.transport.close()
                return response
