"""The Anthropic Messages and OpenAI Responses request bodies as the chat shape the prefix keys read.

A replica renders all three through the same chat template, so the same conversation keys the
same blocks whichever API carried it: `system` + `messages` + `tools` (Anthropic) and
`instructions` + `input` + `tools` (Responses) map onto a chat body's system message, turns
and tools. Only what is prefix-stable is kept; nothing here is forwarded (the raw body is).
"""

from __future__ import annotations

from typing import Any

_TEXT_PARTS = ("text", "input_text", "output_text")


def _parts(content: Any) -> Any:
    """Text blocks as chat text parts (so they key like chat text); other blocks stay as they are."""
    if not isinstance(content, list):
        return content
    return [
        {"type": "text", "text": part["text"]}
        if isinstance(part, dict) and part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str)
        else part
        for part in content
    ]


def messages_as_chat(body: dict[str, Any]) -> dict[str, Any]:
    """Anthropic `/v1/messages`: system (a string or text blocks) first, then the turns."""
    system = body.get("system")
    turns: list[Any] = [{"role": "system", "content": _parts(system)}] if system else []
    messages = body.get("messages")
    if isinstance(messages, list):
        turns += [
            {"role": m.get("role", ""), "content": _parts(m.get("content"))} if isinstance(m, dict) else m
            for m in messages
        ]
    return {"messages": turns, "tools": body.get("tools")}


def responses_as_chat(body: dict[str, Any]) -> dict[str, Any]:
    """OpenAI `/v1/responses`: instructions as the system message, then `input` (a string or items;
    items without a role, such as function calls and their outputs, key by their JSON)."""
    instructions = body.get("instructions")
    turns: list[Any] = (
        [{"role": "system", "content": instructions}] if isinstance(instructions, str) and instructions else []
    )
    given = body.get("input")
    if isinstance(given, str):
        turns.append({"role": "user", "content": given})
    elif isinstance(given, list):
        turns += [
            {"role": item["role"], "content": _parts(item.get("content"))}
            if isinstance(item, dict) and isinstance(item.get("role"), str)
            else {"role": "item", "content": [item]}
            for item in given
        ]
    return {"messages": turns, "tools": body.get("tools")}


CHAT_SHAPED = {"messages": messages_as_chat, "responses": responses_as_chat}
"""Endpoints whose prompt is a conversation in another API's shape."""
