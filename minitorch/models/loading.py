"""load_model: registry name, Hugging Face model folder or GGUF file -> (Qwen2ForCausalLM, Tokenizer)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional, Union

from .config import Qwen2Config
from .errors import ModelLoadError
from .gguf_io import load_gguf_weights
from .qwen2 import Qwen2ForCausalLM
from .registry import resolve
from .safetensors_io import load_safetensors_folder
from .tokenizer import Tokenizer


def load_model(
    name_or_path: Union[str, Path],
    backend: Any = None,
    dtype: str = "float32",
    progress: bool = True,
    cache_dir: Optional[Union[str, Path]] = None,
    weights: str = "auto",
    requantize: Optional[int] = None,
) -> tuple[Qwen2ForCausalLM, Tokenizer]:
    """Load a Qwen2-architecture model and its tokenizer.

    `name_or_path`: a registry name ('qwen2.5-coder-0.5b-instruct', 'deepseek-r1-distill-qwen-7b', ...),
    a Hugging Face folder (config.json, tokenizer.json, *.safetensors) or a .gguf file. A GGUF is
    converted once into the cache folder (packed or dequantized, see `weights`); later loads memory-map it.
    `backend` defaults to FastBackend. Errors for users are ModelLoadError naming the file.

    `weights`: "packed" keeps a GGUF's quantized tensors in their stored form (4-, 6- or 8-bit codes +
    per-block scales, minitorch/packed.py): the same values in about a third of the memory, read by a faster kernel,
    on the CPU backends only; "float32" uses the dequantized float32 arrays (the only form for safetensors
    folders and the CUDA backend); "auto" (default) picks packed for a GGUF file on a backend with a packed
    kernel, else float32.

    `requantize=4` (packed GGUF loads only): the tensors stored with 6- or 8-bit codes (Q5_0, Q6_K, Q8_0, ...)
    are requantized to 4-bit codes (PackedWeight.quantize4, Q4_K's layout: about half the bytes a forward
    reads, lossy), once, into a cache folder of their own. Meant for a draft model: its weights decide how
    many drafts the target accepts, never what the target writes.
    """
    if requantize not in (None, 4):
        raise ModelLoadError(f"requantize must be None or 4, got {requantize!r}")
    if weights not in ("auto", "packed", "float32"):
        raise ModelLoadError(f"weights must be 'auto', 'packed' or 'float32', got {weights!r}")
    if backend is None:
        from .. import FastBackend

        backend = FastBackend
    t0 = time.perf_counter()
    path = resolve(name_or_path, cache_dir, progress)
    if path.is_dir():
        if weights == "packed" or requantize:
            raise ModelLoadError(f"{path}: packed weights (and requantize) come from a GGUF file's quantized "
                                 "tensors; a safetensors folder loads as float32")
        config = Qwen2Config.from_json(path / "config.json")
        arrays = load_safetensors_folder(path)
        tok = Tokenizer.from_folder(path)
    elif _is_gguf(path):
        has_kernel = getattr(backend, "packed_linear", None) is not None
        if weights == "auto":
            weights = "packed" if has_kernel else "float32"
        if weights == "packed":
            if not has_kernel:
                raise ModelLoadError(f"{getattr(backend, 'name', backend)} has no packed kernel; use weights='float32'")
            from .gguf_packed import load_packed

            config, arrays, tok_dir = load_packed(path, cache_dir, progress, requantize=requantize)
        elif requantize:
            raise ModelLoadError(f"{path}: requantize needs packed weights (weights='packed' on a CPU backend)")
        else:
            config, arrays, tok_dir = load_gguf_weights(path, cache_dir, progress)
        tok = Tokenizer.from_folder(tok_dir)
        tok.source = str(path)
    else:
        raise ModelLoadError(f"{path} is neither a model folder nor a GGUF file")
    if tok.vocab_size > config.vocab_size:
        raise ModelLoadError(f"{path}: tokenizer has {tok.vocab_size} tokens but the embedding only {config.vocab_size} rows")
    model = Qwen2ForCausalLM(config, backend, dtype)
    model.load_weights(arrays, source=str(path))
    model.load_seconds = time.perf_counter() - t0
    return model, tok


def _is_gguf(path: Path) -> bool:
    if path.suffix.lower() == ".gguf":
        return True
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"
