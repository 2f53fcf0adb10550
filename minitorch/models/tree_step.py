"""One step over a tree of tokens (draft trees, issue 44): where each row sits and what it sees, from its parent.

A tree step feeds T rows after the cache's `start` positions. Row t hangs under row parents[t] of the same step, or
under the cache (-1): it sits at position start + depth(t) (depth 0 for a row under the cache) and attends to the
cache and to its own ancestors and itself, never to a sibling's branch. A chain, parents [-1, 0, 1, ...], is a plain
causal step. The rows' K/V are written at slots start .. start + T - 1 in row order; once a path is accepted,
`keep_path` moves its rows' K/V to the positions they now hold and truncates the cache there.

A row's keys are gathered in slot order, and a row's ancestors come before it, so a row sees the same keys in the same
order as a causal step over its own path: its logits are that step's, bit for bit, on the CPU's one-call forward
(minitorch/cpu/fused.py's attention with a mask).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class TreeStep:
    """Where a step's T rows sit and what they see: row t at positions[t]; the cache's slots below mask_from always,
    and slot mask_from + j where mask[t, j] (mask (T, W), W reaching the step's last row). A draft head growing a tree
    over several steps keeps mask_from at the tree's first slot, so a row sees its ancestors of earlier steps too."""

    positions: np.ndarray  # (T,) int64
    mask: np.ndarray  # (T, W) uint8
    mask_from: int

    def causal(self, start: int) -> bool:
        """Whether this step, after `start` cached slots, is a plain causal one (a chain, or one row seeing every slot
        before it): each row at the next position, seeing the whole cache and the rows before it."""
        t, seen = len(self.positions), start - self.mask_from
        return (np.array_equal(self.positions, np.arange(start, start + t)) and bool(self.mask[:, :seen].all())
                and np.array_equal(self.mask[:, seen:], np.tril(np.ones((t, t), np.uint8))))


def tree_layout(parents: Sequence[int], start: int) -> TreeStep:
    """The TreeStep of rows under `parents` after `start` cached positions (mask_from = start, mask (T, T))."""
    t_len = len(parents)
    positions = np.empty(t_len, dtype=np.int64)
    mask = np.zeros((t_len, t_len), dtype=np.uint8)
    for t, p in enumerate(parents):
        p = int(p)
        if not -1 <= p < t:
            raise ValueError(f"row {t}'s parent {p} must be an earlier row of the step or -1 (the cache)")
        if p == -1:
            positions[t] = start
        else:
            positions[t] = positions[p] + 1
            mask[t] = mask[p]
        mask[t, t] = 1
    return TreeStep(positions, mask, start)


def keep_path(cache: Any, start: int, rows: Sequence[int]) -> None:
    """Keep the step rows `rows` (slots start + r, increasing, each under the one before) as positions start,
    start + 1, ...: their K/V moved there in every layer, the cache truncated after them."""
    rows = [int(r) for r in rows]
    if any(b <= a for a, b in zip(rows, rows[1:])) or (rows and (rows[0] < 0 or start + rows[-1] >= cache.length)):
        raise ValueError(f"rows {rows} are not increasing rows of the last step (cache length {cache.length})")
    src = np.asarray(rows, dtype=np.int64) + start
    n = len(rows)
    if rows != list(range(n)):
        for buf in (*cache.keys, *cache.values):
            a = buf.to_numpy()[0]  # (Hkv, max_len, D), the cache's own storage
            a[:, start:start + n] = a[:, src]  # the fancy index copies first: overlapping slots are safe
    cache.truncate(start + n)
