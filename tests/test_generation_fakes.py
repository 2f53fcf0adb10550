"""Tiny numpy models that follow the generation model protocol (new_cache, __call__, config.vocab_size),
used by the generation tests so they need neither the core nor minitorch.models.

FakeModel is a small recurrent net: h_t = tanh(E[x_t] + A h_{t-1}), logits_t = scale * W h_t, so the
logits depend on the whole context and the cache (one h per position) can be rolled back.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest


@dataclass
class FakeConfig:
    vocab_size: int
    max_position_embeddings: int = 4096


class FakeCache:
    """Per-position hidden states and ids; `length` positions are valid."""

    def __init__(self, max_len: int, hidden: int) -> None:
        self.max_len = max_len
        self.length = 0
        self.h = np.zeros((max_len, hidden), dtype=np.float64)
        self.ids = np.full(max_len, -1, dtype=np.int64)

    def truncate(self, n: int) -> None:
        if not 0 <= n <= self.length:
            raise ValueError(f"truncate({n}) outside [0, {self.length}]")
        self.length = n


class FakeLogits:
    """Stands in for a minitorch Tensor: the engine only calls to_numpy()."""

    def __init__(self, arr: np.ndarray) -> None:
        self._arr = arr

    def to_numpy(self) -> np.ndarray:
        return self._arr


class FakeModel:
    """Deterministic context-dependent logits; `like` + `noise` makes a draft close to a target."""

    def __init__(self, vocab: int, hidden: int = 16, seed: int = 0, scale: float = 6.0,
                 like: "FakeModel | None" = None, noise: float = 0.0, tensor_out: bool = False,
                 max_positions: int = 4096) -> None:
        rng = np.random.default_rng(seed)
        if like is None:
            self.E = rng.normal(size=(vocab, hidden))
            self.A = rng.normal(size=(hidden, hidden)) / np.sqrt(hidden)
            self.W = rng.normal(size=(vocab, hidden)) / np.sqrt(hidden)
        else:
            v = min(vocab, like.E.shape[0])
            self.E = np.zeros((vocab, hidden))
            self.W = np.zeros((vocab, hidden))
            self.E[:v] = like.E[:v]
            self.W[:v] = like.W[:v]
            if vocab > v:
                self.E[v:] = rng.normal(size=(vocab - v, hidden))
                self.W[v:] = rng.normal(size=(vocab - v, hidden)) / np.sqrt(hidden)
            self.A = like.A.copy()
            self.E += noise * rng.normal(size=self.E.shape)
            self.W += noise * rng.normal(size=self.W.shape) / np.sqrt(hidden)
        self.scale = scale
        self.hidden = hidden
        self.config = FakeConfig(vocab_size=vocab, max_position_embeddings=max_positions)
        self.tensor_out = tensor_out
        self.calls = 0

    def new_cache(self, max_len: int) -> FakeCache:
        return FakeCache(max_len, self.hidden)

    def __call__(self, ids, cache: FakeCache, last_n: int | None = None, head_rows: int | None = None):
        ids = [int(i) for i in ids]
        if not ids:
            raise ValueError("empty forward")
        if cache.length + len(ids) > cache.max_len:
            raise ValueError(f"cache overflow: {cache.length} + {len(ids)} > {cache.max_len}")
        self.calls += 1
        out = np.empty((1, len(ids), self.W.shape[0]), dtype=np.float32)
        h = cache.h[cache.length - 1] if cache.length else np.zeros(self.hidden)
        for t, x in enumerate(ids):
            h = np.tanh(self.E[x] + self.A @ h)
            cache.h[cache.length] = h
            cache.ids[cache.length] = x
            cache.length += 1
            out[0, t] = self.scale * (self.W @ h)
        if last_n is not None:
            out = out[:, len(ids) - last_n:]
        if head_rows is not None:
            out = out[:, :, :head_rows]
        return FakeLogits(out) if self.tensor_out else out


def fresh_cache(model: FakeModel, ids: list[int]) -> FakeCache:
    """The cache a fresh forward over ids produces."""
    cache = model.new_cache(max(len(ids), 1))
    if ids:
        model(ids, cache)
    return cache


def assert_cache_equal(cache: FakeCache, ref: FakeCache) -> None:
    assert cache.length == ref.length
    n = ref.length
    np.testing.assert_array_equal(cache.ids[:n], ref.ids[:n])
    np.testing.assert_allclose(cache.h[:n], ref.h[:n], rtol=0, atol=1e-12)


def test_fake_model_cached_equals_uncached():
    m = FakeModel(20)
    ids = [1, 5, 7, 3, 2]
    full = m(ids, m.new_cache(8))
    c = m.new_cache(8)
    parts = [m(ids[:2], c), m(ids[2:3], c), m(ids[3:], c)]
    np.testing.assert_allclose(np.concatenate(parts, axis=1), full, atol=1e-6)
    c.truncate(2)
    np.testing.assert_allclose(m(ids[2:], c), full[:, 2:], atol=1e-6)
    with pytest.raises(ValueError):
        m([1] * 9, m.new_cache(8))
