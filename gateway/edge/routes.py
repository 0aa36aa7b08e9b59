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

from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.config.features import MODEL_ROUTES, RoutesConfig

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def add_model_routes(app: web.Application, handler_for: Callable[[str], Handler], config: RoutesConfig) -> None:
    for path, endpoint in MODEL_ROUTES.items():
        app.router.add_post(path, handler_for(endpoint))
    for path in config.passthrough:
        app.router.add_post(path, handler_for("passthrough"))
