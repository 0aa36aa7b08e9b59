"""vLLM's audio routes on the stub: `/v1/audio/transcriptions` and `/v1/audio/translations`.

The stub has no speech model: it reads the multipart form as vLLM does (`model`, the `file` upload,
`response_format`) and answers fixed text that names the upload's size, in vLLM's JSON shape (or
plain text for `response_format: text`), so a client and the gateway see the real exchange.
"""

from __future__ import annotations

from aiohttp import BodyPartReader, web

from gateway.errors import BadRequestError
from replica_stub.generation import CONFIG
from replica_stub.protocol import check_model


def add_routes(app: web.Application) -> None:
    async def transcribe(request: web.Request) -> web.Response:
        if not (request.content_type or "").startswith("multipart/"):
            raise BadRequestError("expected a multipart/form-data upload")
        fields: dict[str, str] = {}
        size = None
        async for part in await request.multipart():
            if not isinstance(part, BodyPartReader):  # a nested multipart: no field of this form
                continue
            if part.filename:
                size = len(await part.read())
            elif part.name:
                fields[part.name] = await part.text()
        if size is None:
            raise BadRequestError("`file` is required", param="file")
        check_model(fields, request.app[CONFIG].model)
        text = f"{request.path.rsplit('/', 1)[1]} of {size} bytes of audio"
        if fields.get("response_format") == "text":
            return web.Response(text=text)
        return web.json_response({"text": text, "usage": {"type": "duration", "seconds": max(1, size // 32000)}})

    app.router.add_post("/v1/audio/transcriptions", transcribe)
    app.router.add_post("/v1/audio/translations", transcribe)
