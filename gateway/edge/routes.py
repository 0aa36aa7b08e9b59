"""The model routes: every POST route a vLLM server answers, each routed by its body's `model`.

The body is forwarded byte for byte; the endpoint name says how its prompt is read for the prefix
keys (`gateway.prompt.prefix_keys.prompt_source`): chat and completions as before, Anthropic messages and
Responses bodies as the conversation they carry (`gateway.prompt.api_shapes`), embeddings by their `input`,
pooling routes by their `prompt` if any (most have none: they route by load), the audio routes by
load (their body is a multipart form, of which only the text fields are read: `gateway.edge.multipart_form`).
`routes.passthrough` adds more paths (a newer vLLM route, a custom one) routed the same way; routes
are registered at start, so a change there needs a restart.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from gateway.errors import ConfigError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

MODEL_ROUTES: dict[str, str] = {
    "/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/embeddings": "embeddings",
    "/v1/messages": "messages", "/v1/responses": "responses",
    "/tokenize": "tokenize", "/detokenize": "detokenize",
    "/v1/rerank": "rerank", "/rerank": "rerank", "/v2/rerank": "rerank", "/v1/score": "score", "/score": "score",
    "/pooling": "pooling", "/classify": "classify",
    "/v1/audio/transcriptions": "audio", "/v1/audio/translations": "audio",  # multipart: the form's `model`
}
RESERVED = ("/health", "/ready", "/metrics", "/admin/", "/v1/models", "/dashboard", "/dashboard/")  # the gateway's own
_PATH = re.compile(r"(/[A-Za-z0-9._~-]+)+")


@dataclass(frozen=True)
class RoutesConfig:
    """YAML `routes`."""

    passthrough: tuple[str, ...] = ()  # more POST paths forwarded to the pool named by the body's `model`
    default_pool: str | None = None  # where a `model` no pool or alias names goes (gateway.routing.model_names)

    def validate(self, key: str) -> None:
        for i, path in enumerate(self.passthrough):
            where = f"{key}.passthrough[{i}]"
            if not _PATH.fullmatch(path):
                raise ConfigError(f"expected a path like /v1/something, got {path!r}", key=where)
            if path in MODEL_ROUTES or any(path == r or path.startswith(r) for r in RESERVED if r.endswith("/")) \
                    or path in RESERVED:
                raise ConfigError(f"{path} is already a gateway route", key=where)
            if path in self.passthrough[:i]:
                raise ConfigError(f"{path} is listed twice", key=where)


def add_model_routes(app: web.Application, handler_for: Callable[[str], Handler], config: RoutesConfig) -> None:
    for path, endpoint in MODEL_ROUTES.items():
        app.router.add_post(path, handler_for(endpoint))
    for path in config.passthrough:
        app.router.add_post(path, handler_for("passthrough"))
