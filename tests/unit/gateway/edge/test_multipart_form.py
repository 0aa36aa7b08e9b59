"""The text fields of a multipart form, read for routing; file parts skipped; bad forms are 400s."""

from __future__ import annotations

import pytest

from gateway.edge.multipart_form import form_fields
from gateway.errors import BadRequestError

pytestmark = pytest.mark.timeout(10)


def form(boundary: str, *parts: tuple[str, str | None, bytes]) -> bytes:
    out = b""
    for name, filename, value in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + value + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


def test_text_fields_are_read_and_the_file_is_not() -> None:
    audio = b"RIFF" + bytes(range(256)) * 4 + b"\r\n--not-the-boundary\r\n"
    raw = form(
        "xyz",
        ("file", "a.wav", audio),
        ("model", None, b"whisper"),
        ("stream", None, b"true"),
        ("prompt", None, "caf\u00e9".encode()),
    )
    assert form_fields(raw, 'multipart/form-data; boundary="xyz"') == {
        "model": "whisper",
        "stream": True,
        "prompt": "caf\u00e9",
    }
    assert form_fields(raw, "multipart/form-data; boundary=xyz")["stream"] is True


@pytest.mark.parametrize(
    ("raw", "content_type"),
    [
        (b'{"model": "m"}', "application/json"),
        (b"--b\r\nno headers here", "multipart/form-data; boundary=b"),
        (b"", "multipart/form-data"),
    ],
)
def test_a_body_that_is_not_a_form_is_a_400(raw: bytes, content_type: str) -> None:
    with pytest.raises(BadRequestError):
        form_fields(raw, content_type)
