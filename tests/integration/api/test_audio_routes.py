"""The audio routes through a real gateway to real stubs, with the `openai` SDK: a generated WAV
upload reaches the pool its form's `model` names, byte for byte (the stub reports its size)."""

from __future__ import annotations

import io
import wave
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.gateway_procs import MODEL, pool, running, start_gateway, start_stub

pytestmark = pytest.mark.timeout(60)


def wav(seconds: float = 0.5, rate: int = 16000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(int(seconds * rate) * 2))
    return out.getvalue()


def test_transcription_and_translation_reach_the_named_pool(tmp_path: Path) -> None:
    with running() as track:
        chat = track(start_stub("chat-0"))
        whisper = track(start_stub("whisper-0", "whisper-sim"))
        gateway = track(
            start_gateway(
                tmp_path, {MODEL: pool(("chat-0", chat.url)), "whisper-sim": pool(("whisper-0", whisper.url))}
            )
        )
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=20)
        audio = wav()
        done = client.audio.transcriptions.with_raw_response.create(
            model="whisper-sim", file=("a.wav", audio, "audio/wav")
        )
        assert done.headers["X-Replica-Id"] == "whisper-0"
        assert done.parse().text == f"transcriptions of {len(audio)} bytes of audio"  # the upload, untouched
        # Plain HTTP: the SDK's translations call is deprecated.
        text = httpx.post(
            f"{gateway.url}/v1/audio/translations",
            files={"file": ("a.wav", audio, "audio/wav")},
            data={"model": "whisper-sim", "response_format": "text"},
            timeout=10,
        )
        assert text.status_code == 200 and text.text == f"translations of {len(audio)} bytes of audio"
        with pytest.raises(openai.NotFoundError):
            client.audio.transcriptions.create(model="nobody", file=("a.wav", audio, "audio/wav"))
        bad = httpx.post(f"{gateway.url}/v1/audio/transcriptions", json={"model": "whisper-sim"}, timeout=10)
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "BadRequestError"
