"""Qwen2 / DeepSeek-R1-Distill-Qwen models on MiniTorch: config, model, KV cache, loaders, tokenizer."""

from .config import Qwen2Config
from .errors import IncompatibleModelsError, ModelLoadError
from .kv_cache import KVCache
from .loading import load_model
from .qwen2 import Qwen2ForCausalLM
from .registry import DEFAULT_DRAFT, DEFAULT_TARGET, REGISTRY, cache_root, resolve
from .tokenizer import Tokenizer, check_compatible, load_tokenizer

__all__ = [
    "DEFAULT_DRAFT", "DEFAULT_TARGET", "REGISTRY", "IncompatibleModelsError", "KVCache", "ModelLoadError",
    "Qwen2Config", "Qwen2ForCausalLM", "Tokenizer", "cache_root", "check_compatible", "load_model",
    "load_tokenizer", "resolve",
]
