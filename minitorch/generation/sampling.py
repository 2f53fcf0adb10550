"""Sampling: logits -> probabilities -> one token, the gpt-fast way (`logits_to_probs`, `sample`).

Order of the processors follows transformers: temperature, then top-k, then top-p. Probabilities are
computed in float64 with numpy on the one row that is needed, so the per-token overhead stays small.
A `SamplingConfig` with temperature 0 means greedy (argmax). Every call that samples takes a
`numpy.random.Generator` made from the config's seed, so each run reproduces.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SamplingConfig:
    """How to pick the next token. temperature 0 = greedy; top_k 0 = off; top_p 1.0 = off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or not np.isfinite(self.temperature):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, (int, np.integer)):
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not isinstance(self.top_p, (int, float)) or not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        """True when the next token is the argmax (temperature 0)."""
        return self.temperature == 0.0

    def make_rng(self) -> np.random.Generator:
        """A fresh generator for one generation call (same seed -> same run)."""
        return np.random.default_rng(self.seed)


def logits_rows(logits: Any, vocab_size: int | None = None) -> np.ndarray:
    """(1, T, V) model logits (minitorch Tensor or numpy) -> numpy (T, V') view, V' = min(V, vocab_size).

    On the CPU backend this is a view of the tensor's storage (no copy): read it before the model's
    next call.
    """
    arr = logits if isinstance(logits, np.ndarray) else logits.to_numpy()
    if arr.ndim != 3 or arr.shape[0] != 1:
        raise ValueError(f"expected model logits of shape (1, T, V), got {tuple(arr.shape)}")
    rows = arr[0]  # (T, V)
    if vocab_size is not None:
        rows = rows[:, :vocab_size]
    return rows


def greedy_tokens(rows: np.ndarray) -> np.ndarray:
    """Argmax of each row: (T, V) -> (T,) int64 (first index wins on ties, as torch.argmax)."""
    return np.argmax(rows, axis=-1)


def logits_to_probs(row: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """One row of logits (V,) -> float64 probabilities (V,) after temperature, top-k and top-p.

    Greedy configs give the one-hot distribution of the argmax, so the same acceptance rule covers
    both modes.
    """
    v = row.shape[-1]
    if cfg.greedy:
        probs = np.zeros(v, dtype=np.float64)
        probs[int(np.argmax(row))] = 1.0
        return probs
    x = row.astype(np.float64) / cfg.temperature
    if 0 < cfg.top_k < v:
        # keep the k largest (ties at the k-th value are kept, as transformers' TopKLogitsWarper)
        kth = np.partition(x, v - cfg.top_k)[v - cfg.top_k]
        x = np.where(x < kth, -np.inf, x)
    x = x - np.max(x)
    probs = np.exp(x)
    probs /= probs.sum()
    if cfg.top_p < 1.0:
        probs = _top_p_filter(probs, cfg.top_p)
    return probs


def _top_p_filter(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (at least one; of equally
    likely tokens the lower ids first), renormalize.

    Only the head of the distribution is sorted: the k most likely tokens (k doubling from 64) are
    picked with argpartition until their mass reaches top_p, since the nucleus lies inside them.
    """
    v = probs.shape[0]
    k = min(64, v)
    while True:
        head = np.argpartition(-probs, k - 1)[:k] if k < v else np.arange(v)
        if k == v or probs[head].sum() >= top_p:
            break
        k = min(4 * k, v)
    # every token as likely as the head's least likely one too, in token-id order: ties at the nucleus
    # edge are then kept lower ids first whatever order argpartition left them in (the device does the same)
    head = np.flatnonzero(probs >= probs[head].min())
    order = head[np.argsort(-probs[head], kind="stable")]
    cum = np.cumsum(probs[order])
    # number kept: first index where the cumulative mass reaches top_p, inclusive
    n_keep = int(np.searchsorted(cum, top_p - 1e-12, side="left")) + 1
    n_keep = min(max(n_keep, 1), order.shape[0])
    out = np.zeros_like(probs)
    keep = order[:n_keep]
    out[keep] = probs[keep]
    out /= out.sum()
    return out


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one index from a probability vector (inverse CDF with one uniform draw)."""
    cdf = np.cumsum(probs)
    u = rng.random() * cdf[-1]
    idx = int(np.searchsorted(cdf, u, side="right"))
    idx = min(idx, probs.shape[0] - 1)
    # skip zero-probability entries that a float edge case could land on
    while probs[idx] <= 0.0 and idx > 0:
        idx -= 1
    return idx


def next_token(row: np.ndarray, cfg: SamplingConfig, rng: np.random.Generator) -> int:
    """Pick the next token from one row of logits: argmax when greedy, else sample."""
    if cfg.greedy:
        return int(np.argmax(row))
    return sample(logits_to_probs(row, cfg), rng)
