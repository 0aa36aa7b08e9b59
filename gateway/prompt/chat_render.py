"""A chat request's messages as vLLM hands them to the model's chat template, and that template.

The gateway renders chat templates in process (`gateway.prompt.tokenizers`) and its keys are only as good
as the match with the engine's own rendering, token for token. What vLLM does before the template
(`vllm/renderers/chat_utils.py`, `hf.py`, 0.32):
- content-part lists become one string, the text parts joined with "\\n" (as the stub does);
- keys whose value is None are dropped (as transformers does);
- a `developer` message, when the template never names that role, becomes `system`, and then all
  system messages merge into one at position 0, their non-empty contents joined with "\\n\\n".
The template runs in transformers' sandbox: the same environment options, filters and globals.
The conformance test (tests/vllm/test_vllm_chat_render.py) compares this with vLLM's /tokenize.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from gateway.errors import ConfigError


def render_content(content: Any) -> str:
    """A message's content: a string, None, or a list of OpenAI content parts, whose text parts are
    joined with "\n" as vLLM joins them (other parts carry no text)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(
        part.get("text", "") for part in content if isinstance(part, Mapping) and part.get("type", "text") == "text"
    )


def engine_message(message: Any) -> dict[str, Any] | None:
    """One message with its content flattened to a string and None values dropped; None if malformed."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        return None
    content = message.get("content")
    if not (content is None or isinstance(content, (str, list))):
        return None
    flat = {k: v for k, v in message.items() if v is not None}
    flat["content"] = render_content(content)
    return flat


@lru_cache(maxsize=32)
def _knows_developer(template: str) -> bool:
    return '"developer"' in template or "'developer'" in template


def vllm_conversation(messages: list[dict[str, Any]], template: str) -> list[dict[str, Any]]:
    """`developer` as `system`, system messages merged at the front, where the template lacks the role."""
    if not any(m["role"] == "developer" for m in messages) or _knows_developer(template):
        return messages
    converted = [
        {**{k: v for k, v in m.items() if k != "tools"}, "role": "system"} if m["role"] == "developer" else m
        for m in messages
    ]
    systems = [i for i, m in enumerate(converted) if m["role"] == "system"]
    if systems in ([], [0]):
        return converted
    merged = {
        "role": "system",
        "content": "\n\n".join(converted[i]["content"] for i in systems if converted[i].get("content")),
    }
    return [merged, *(m for m in converted if m["role"] != "system")]


def token_text(token: Any) -> str:
    """A special token of tokenizer_config.json, given as a string or as an AddedToken map."""
    return token["content"] if isinstance(token, dict) else str(token)


def chat_templates(folder: Path, config: Mapping[str, Any]) -> dict[str, str]:
    """Named chat templates ("default", maybe "tool_use"), as transformers finds them."""
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return {"default": jinja_file.read_text()}
    template = config.get("chat_template")
    if isinstance(template, str):
        return {"default": template}
    if isinstance(template, list):
        named = {t["name"]: t["template"] for t in template if isinstance(t, dict) and "name" in t}
        if "default" in named:
            return named
    raise ConfigError(f"no chat template in {folder} (chat_template.jinja or tokenizer_config.json)")


def compile_template(source: str) -> Any:
    """The template in transformers' sandbox: same environment options, filters and globals."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    class Generation(jinja2.ext.Extension):
        """transformers' `{% generation %}` tag (marks assistant tokens for training): renders its body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
    return env.from_string(source)
