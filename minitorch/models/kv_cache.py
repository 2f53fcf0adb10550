"""Key/value cache for incremental decoding, with truncation (rollback of rejected draft tokens)."""

from __future__ import annotations

from typing import Any

from .. import zeros
from ..tensor import Tensor


class KVCache:
    """Per-layer key and value buffers of shape (1, n_kv_heads, max_len, head_dim).

    `length` positions are filled. A forward over T new tokens writes positions [length, length+T)
    and then advances `length`; `truncate(n)` forgets everything from position n on (the stale
    entries are simply overwritten by the next forward).
    """

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, max_len: int, backend: Any, dtype: str = "float32") -> None:
        if max_len <= 0:
            raise ValueError(f"KV cache max_len must be positive, got {max_len}")
        self.max_len = int(max_len)
        self.length = 0
        shape = (1, n_kv_heads, self.max_len, head_dim)
        self.keys: list[Tensor] = [zeros(shape, backend=backend, dtype=dtype) for _ in range(n_layers)]
        self.values: list[Tensor] = [zeros(shape, backend=backend, dtype=dtype) for _ in range(n_layers)]

    def check_room(self, n_new: int) -> None:
        """Raise a clear ValueError when n_new more positions would not fit."""
        if self.length + n_new > self.max_len:
            raise ValueError(
                f"KV cache full: {self.length} cached + {n_new} new positions exceed max_len {self.max_len}; "
                f"create the cache with a larger max_len"
            )

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k, v (1, Hkv, T, D) at positions [length, length+T); return keys/values for [0, length+T)."""
        t = k.shape[2]
        self.keys[layer].narrow(2, self.length, t).copy_(k)
        self.values[layer].narrow(2, self.length, t).copy_(v)
        end = self.length + t
        return self.keys[layer].narrow(2, 0, end), self.values[layer].narrow(2, 0, end)  # (1, Hkv, end, D)

    def advance(self, n_new: int) -> None:
        """Mark n_new more positions as filled (called once per forward, after every layer)."""
        self.length += n_new

    def truncate(self, n: int) -> None:
        """Keep only the first n positions (0 <= n <= length)."""
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot truncate KV cache of length {self.length} to {n}")
        self.length = int(n)
