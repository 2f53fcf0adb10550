"""Qwen2 configuration (Hugging Face field names), read from config.json or GGUF metadata."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Optional, Union

from .errors import ModelLoadError


@dataclass
class Qwen2Config:
    """Hyper-parameters of a Qwen2 / DeepSeek-R1-Distill-Qwen decoder (HF names; unknown keys ignored)."""

    vocab_size: int = 151936
    hidden_size: int = 1536
    intermediate_size: int = 8960
    num_hidden_layers: int = 28
    num_attention_heads: int = 12
    num_key_value_heads: int = 2
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    head_dim: Optional[int] = None  # None -> hidden_size // num_attention_heads
    bos_token_id: Optional[int] = None
    eos_token_id: Union[int, list[int], None] = None
    model_type: str = "qwen2"
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ModelLoadError(
                    f"hidden_size {self.hidden_size} is not divisible by num_attention_heads {self.num_attention_heads}"
                )
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelLoadError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ModelLoadError(f"head_dim {self.head_dim} must be even for rotary embeddings")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Qwen2Config":
        """Build from a config.json dict; unknown keys are ignored (kept in `extra`)."""
        d = dict(d)
        rope = d.get("rope_parameters") or {}
        if "rope_theta" not in d and "rope_theta" in rope:  # transformers >= 5 nests it
            d["rope_theta"] = rope["rope_theta"]
        scaling = d.get("rope_scaling") or rope
        rope_type = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
        if rope_type not in ("default", None):
            raise ModelLoadError(f"rope scaling type {rope_type!r} is not supported (only default rotary embeddings)")
        if d.get("use_sliding_window"):
            raise ModelLoadError("sliding-window attention (use_sliding_window: true) is not supported")
        names = {f.name for f in fields(cls)} - {"extra"}
        known = {k: v for k, v in d.items() if k in names and v is not None}
        extra = {k: v for k, v in d.items() if k not in names}
        cfg = cls(**known, extra=extra)
        if cfg.model_type not in ("qwen2",):
            raise ModelLoadError(f"model_type {cfg.model_type!r} is not supported (Qwen2 architecture only)")
        return cfg

    @classmethod
    def from_json(cls, path: Union[str, Path]) -> "Qwen2Config":
        """Read a Hugging Face config.json; a missing or malformed file is a ModelLoadError naming it."""
        path = Path(path)
        if not path.is_file():
            raise ModelLoadError(f"missing model config {path}")
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except json.JSONDecodeError as e:
            raise ModelLoadError(f"malformed JSON in {path}: {e}") from None
        except TypeError as e:
            raise ModelLoadError(f"bad value in {path}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable dict with HF field names (used to cache GGUF configs)."""
        d = asdict(self)
        d.pop("extra")
        return d

    @property
    def eos_token_ids(self) -> list[int]:
        """eos_token_id as a list (HF allows int or list)."""
        if self.eos_token_id is None:
            return []
        if isinstance(self.eos_token_id, int):
            return [self.eos_token_id]
        return list(self.eos_token_id)
