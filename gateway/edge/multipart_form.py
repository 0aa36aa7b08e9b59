"""The text fields of a multipart/form-data body (the audio routes' uploads): enough to route the
request by its `model`. The body is forwarded as it came; file parts are skipped, never decoded."""

from __future__ import annotations

import re
from typing import Any

from gateway.errors import BadRequestError

_BOUNDARY = re.compile(r'boundary="?([^";]+)"?', re.IGNORECASE)
_NAME = re.compile(rb'\bname="([^"]*)"', re.IGNORECASE)
_FILENAME = re.compile(rb"\bfilename\*?=", re.IGNORECASE)
_TRUE = {"true", "1", "yes"}


def form_fields(raw: bytes, content_type: str | None) -> dict[str, Any]:
    """Each non-file field as text (`stream` as a bool); BadRequestError for a body that is not a form."""
    found = (
        _BOUNDARY.search(content_type or "") if (content_type or "").lower().startswith("multipart/form-data") else None
    )
    if found is None:
        raise BadRequestError("expected a multipart/form-data body with a boundary (an audio upload)")
    delimiter = b"--" + found.group(1).strip().encode()
    fields: dict[str, Any] = {}
    for part in raw.split(delimiter)[1:]:
        if part.startswith(b"--"):
            break  # the closing delimiter
        head, separator, value = part.partition(b"\r\n\r\n")
        name = _NAME.search(head)
        if not separator or name is None:
            raise BadRequestError("a form part without a name or headers")
        if _FILENAME.search(head):
            continue
        fields[name.group(1).decode("utf-8", "replace")] = value.removesuffix(b"\r\n").decode("utf-8", "replace")
    if "stream" in fields:
        fields["stream"] = fields["stream"].strip().lower() in _TRUE
    return fields
