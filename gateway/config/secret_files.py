"""Secrets from files (`*_file:` keys), so a Kubernetes Secret or a Docker secret mounts as a file.

Read when the config is loaded (in the sections' `check`), never per request, so a missing or empty file is a
config error naming the key, and a reload re-reads it (rotation). Messages name the file and the
key, never the content.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from gateway.errors import ConfigError, join_key


def read_secret_file(path: str, key: str) -> str:
    """The file's text, surrounding whitespace stripped; ConfigError naming `key` if unreadable or empty."""
    try:
        value = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"cannot read file {path!r}: {reason}", key=key) from None
    if not value:
        raise ConfigError(f"file {path!r} is empty", key=key)
    return value


def secret_lines(path: str, key: str) -> list[tuple[int, str]]:
    """(line number, text) of the file's lines that are neither blank nor `#` comments."""
    lines = read_secret_file(path, key).splitlines()
    return [(n, line.strip()) for n, line in enumerate(lines, 1) if line.strip() and not line.lstrip().startswith("#")]


def read_key(env_name: str | None, file_path: str | None, key: str, env: Mapping[str, str] | None = None) -> str | None:
    """A replica's key (`api_key_env` or `api_key_file`), or None when neither is set; ConfigError naming
    `key` otherwise. Read at load (the sections' `check`) and again when a pool's keys are first used."""
    if env_name is not None and file_path is not None:
        raise ConfigError("set api_key_env or api_key_file, not both", key=join_key(key, "api_key_env"))
    if env_name is not None:
        where = join_key(key, "api_key_env")
        value = (os.environ if env is None else env).get(env_name, "").strip()
        if not value:
            raise ConfigError(f"environment variable {env_name!r} is not set or empty", key=where)
        return _one_line(value, f"environment variable {env_name!r}", where)
    if file_path is not None:
        where = join_key(key, "api_key_file")
        return _one_line(read_secret_file(file_path, where), f"file {file_path!r}", where)
    return None


def _one_line(value: str, source: str, key: str) -> str:
    """A key goes upstream in a header: a line break inside it (a file of two lines) would end the header."""
    if "\n" in value or "\r" in value:
        raise ConfigError(f"{source} holds more than one line: a key is one line", key=key)
    return value
