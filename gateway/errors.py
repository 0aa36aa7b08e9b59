"""The gateway's error tree, translated to OpenAI error JSON at one boundary (the server).

ConfigError                 bad YAML; names the file and the dotted key
GatewayError                anything answered to a client with an error body
├── BadRequestError         400  malformed JSON, wrong types, missing fields
├── AuthenticationError     401  missing or unknown API key
├── PermissionDeniedError   403  admin route without the admin key
├── NotFoundError           404  unknown model or route
├── RequestTimeoutError     408  the client sent its body too slowly
├── PayloadTooLargeError    413  body over the configured limit
├── UnsupportedMediaTypeError 415  a Content-Encoding the gateway does not decode
├── RateLimitError          429  admission queue full / rate limit (Retry-After)
├── UpstreamError           502  replica failed before any byte reached the client
├── NoReplicaError          503  no healthy replica for the model (Retry-After)
└── UpstreamTimeoutError    504  replica did not answer within the deadline
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import orjson


class ConfigError(ValueError):
    """A config file failed validation; `key` is the dotted path of the offending key. One load reports every
    mistake it finds: the first is this error's own, the others follow in `also`."""

    def __init__(self, message: str, *, key: str = "", file: str = "", also: Sequence[ConfigError] = ()) -> None:
        self.key, self.file, self.reason, self.also = key, file, message, tuple(also)
        super().__init__("\n".join(one.line for one in self.each))

    @property
    def line(self) -> str:
        """This mistake alone: `file:key: reason`."""
        where = ":".join(part for part in (self.file, self.key) if part)
        return f"{where}: {self.reason}" if where else self.reason

    @property
    def each(self) -> tuple[ConfigError, ...]:
        """Every mistake, this one first."""
        return (self, *self.also)

    @classmethod
    def of(cls, errors: Sequence[ConfigError]) -> ConfigError:
        """One error carrying all of `errors` (each flattened), in the order found."""
        flat = [one for error in errors for one in error.each]
        first = flat[0]
        return cls(first.reason, key=first.key, file=first.file, also=flat[1:])

    def in_file(self, file: str) -> ConfigError:
        """The same mistakes, each naming `file`."""
        return ConfigError.of([ConfigError(one.reason, key=one.key, file=file) for one in self.each])

    def under(self, prefix: str) -> ConfigError:
        """The same mistakes, each key taken as relative to `prefix`: a section names its own keys, the
        load says where the section is."""
        return ConfigError.of(
            [ConfigError(one.reason, key=join_key(prefix, one.key), file=one.file) for one in self.each]
        )


def join_key(prefix: str, key: str) -> str:
    """`prefix.key`, `prefix[i]` for a list index, or whichever of the two is not empty."""
    if not prefix or not key:
        return prefix or key
    return f"{prefix}{key}" if key.startswith("[") else f"{prefix}.{key}"


class GatewayError(Exception):
    status = 500
    type = "InternalServerError"

    def __init__(self, message: str, *, param: str | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.retry_after_s = message, param, retry_after_s

    def body(self, hide: Iterable[str] | None = None) -> bytes:
        """The OpenAI error JSON; with `hide` (the replicas' names), none of them and no address in it."""
        message = self.message if hide is None else without_replicas(self.message, hide)
        return error_body(message, self.type, self.status, self.param)

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(max(1, round(self.retry_after_s)))
        return headers


# What reads as a network address: a URL, a bracketed IPv6 address, host:port, a bare IPv4 address.
_ADDRESS = re.compile(
    r"\b[a-z][a-z0-9+.-]*://[^\s,;()]+|\[[0-9a-f:]+\](?::\d+)?|\b[\w.-]+:\d{1,5}\b|\b\d{1,3}(?:\.\d{1,3}){3}\b",
    re.IGNORECASE,
)
HIDDEN = "(hidden)"


def without_replicas(message: str, names: Iterable[str]) -> str:
    """`message` naming none of `names` (the replicas' ids and URLs) and no network address: what a client
    reads when `headers.replica_id` is off (a replica configured by URL alone is named by its address)."""
    for name in sorted({n for n in names if n}, key=len, reverse=True):
        message = message.replace(name, HIDDEN)
    return _ADDRESS.sub(HIDDEN, message)


def error_body(message: str, type_: str, status: int, param: str | None = None) -> bytes:
    """OpenAI/vLLM error JSON: `code` is the integer HTTP status, as vLLM sends it."""
    payload: dict[str, Any] = {"error": {"message": message, "type": type_, "param": param, "code": status}}
    return orjson.dumps(payload)


class BadRequestError(GatewayError):
    status, type = 400, "BadRequestError"


class AuthenticationError(GatewayError):
    status, type = 401, "AuthenticationError"


class PermissionDeniedError(GatewayError):
    status, type = 403, "PermissionDeniedError"


class NotFoundError(GatewayError):
    status, type = 404, "NotFoundError"


class RequestTimeoutError(GatewayError):
    status, type = 408, "RequestTimeoutError"


class PayloadTooLargeError(GatewayError):
    status, type = 413, "PayloadTooLargeError"


class UnsupportedMediaTypeError(GatewayError):
    status, type = 415, "UnsupportedMediaTypeError"


class RateLimitError(GatewayError):
    status, type = 429, "RateLimitError"


class UpstreamError(GatewayError):
    status, type = 502, "BadGatewayError"


class NoReplicaError(GatewayError):
    status, type = 503, "ServiceUnavailableError"


class UpstreamTimeoutError(GatewayError):
    status, type = 504, "GatewayTimeoutError"


_HTTP_KINDS = {
    400: "BadRequestError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    408: "RequestTimeoutError",
    413: "PayloadTooLargeError",
    415: "UnsupportedMediaTypeError",
    417: "ExpectationFailedError",
    431: "RequestHeaderFieldsTooLargeError",
    500: "InternalServerError",
}


def http_error_body(status: int, message: str) -> bytes:
    """An error aiohttp itself raised (routing, parsing, Expect) in the OpenAI shape."""
    return error_body(
        message, _HTTP_KINDS.get(status, "BadRequestError" if status < 500 else "InternalServerError"), status
    )


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body parsed as a JSON object, or BadRequestError (the gateway and the stub both)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequestError(f"malformed JSON in request body: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequestError("request body must be a JSON object")
    return body
