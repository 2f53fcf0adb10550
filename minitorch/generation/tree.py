"""Draft trees, the reference (issue 44): several candidate continuations verified at once, the longest accepted path
kept. This file is the definition the fast paths (a tree attention mask in one target step, on the GPU first) are
tested against: each node's logits come from running the target over the context and that node's own path, one path
at a time, so no mask can be wrong here.

A tree hangs below the pending token (the last context token, not yet in the target's cache). Node i holds a drafted
token `tokens[i]` and its parent `parents[i]` (-1: the pending token); a node's path is its ancestors' tokens then its
own. Nodes are numbered parents first (parents[i] < i), as a step verifies them in one pass.

    root row     the target's logits after the context (what a plain step would compute)
    node i row   the target's logits after the context and node i's path

Greedy acceptance walks from the root: the target's argmax of the current row is the next token; if a child of the
current node carries it, that child is accepted and the walk goes on from its row, else the walk stops and the argmax
is the round's correction (or, at a leaf, its bonus token). So a round emits (accepted nodes) + 1 tokens, each the
target's own argmax after the ones before it: greedy output equals the target alone's, whatever the tree holds.

Building a tree (EAGLE-2, arXiv 2406.16858, in its simplest form): from the root, expand the `top_k` most probable next
tokens of each of the `top_k` best frontier nodes for `depth` levels, scoring a node by its path's cumulative log
probability under the drafter, then keep the `budget` best nodes overall (a kept node's ancestors score higher, so
they are kept too).
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .sampling import logits_rows

# a drafter for trees: context tokens -> (token ids, their log probabilities), the k most probable next tokens
TopK = Callable[[Sequence[int], int], tuple[Sequence[int], Sequence[float]]]
# a level of a tree at once: paths below the pending token -> each one's k most probable next tokens and log probs
Expand = Callable[[Sequence[Sequence[int]], int], Sequence[tuple[Sequence[int], Sequence[float]]]]
Extend = Callable[[int, float], bool]  # (depth of a frontier node, its path's probability): is it worth expanding?


def check_tree_request(greedy: bool, top_k: int, depth: int, budget: int, sample_with: str) -> None:
    """One clear ValueError for a tree request either engine refuses: sampling (trees are greedy; sample_with names the
    chain function that samples), or a shape that is not three integers >= 1."""
    if not greedy:
        raise ValueError(f"draft trees are greedy only: sample with chains ({sample_with})")
    for name, v in (("top_k", top_k), ("depth", depth), ("budget", budget)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")


@dataclass
class DraftTree:
    """Drafted tokens below the pending token: node i is tokens[i] under parents[i] (-1: the pending token)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)  # grow_tree's: each node's path's summed log probability

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents) or (self.scores and len(self.scores) != len(self.tokens)):
            raise ValueError("a tree needs one parent (and one score, if any) a token")
        for i, p in enumerate(self.parents):
            if not -1 <= p < i:
                raise ValueError(f"node {i}'s parent {p} must come before it (or be -1, the pending token)")

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, parent: int, score: float | None = None) -> int:
        """A new node under `parent` (with its score, in a tree that keeps them); returns its index."""
        if not -1 <= parent < len(self.tokens):
            raise ValueError(f"no node {parent} to hang a token under")
        if self.tokens and bool(self.scores) != (score is not None):
            raise ValueError("a tree's nodes all have a score or none has")
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        if score is not None:
            self.scores.append(float(score))
        return len(self.tokens) - 1

    def pruned(self, keep: Callable[[int], bool]) -> "DraftTree":
        """The nodes where keep(i) whose ancestors are all kept, renumbered (parents first still)."""
        out, index = DraftTree(), {-1: -1}
        for i, (tok, parent) in enumerate(zip(self.tokens, self.parents)):
            if parent in index and keep(i):
                index[i] = out.add(tok, index[parent], self.scores[i] if self.scores else None)
        return out

    def path(self, i: int) -> list[int]:
        """Node indices from the root's child down to node i."""
        out = []
        while i != -1:
            out.append(i)
            i = self.parents[i]
        return out[::-1]

    def depth(self, i: int) -> int:
        """1 for the pending token's children."""
        return len(self.path(i))

    def children(self, i: int) -> list[int]:
        """Nodes whose parent is i (-1: the pending token's)."""
        return [j for j, p in enumerate(self.parents) if p == i]


def build_tree(topk: TopK, context: Sequence[int], top_k: int, depth: int, budget: int,
               extend: Extend | None = None) -> DraftTree:
    """EAGLE-2's dynamic tree: `depth` levels, each expanding the top_k best frontier nodes (by their path's summed log
    probability) into their top_k next tokens; then the `budget` best nodes of all, renumbered parents first. extend
    (a draft budget's gate): only frontier nodes it accepts are expanded, and the growing stops where none is."""
    return grow_tree(lambda paths, k: [topk(list(context) + list(p), k) for p in paths], top_k, depth, budget,
                     extend)


def grow_tree(expand: Expand, top_k: int, depth: int, budget: int, extend: Extend | None = None) -> DraftTree:
    """build_tree with each level's frontier expanded in one call (a drafter that runs a level as one step)."""
    if top_k < 1 or depth < 1 or budget < 1:
        raise ValueError(f"top_k, depth and budget must be >= 1, got {top_k}, {depth}, {budget}")
    scored: list[tuple[float, int, int, int]] = []  # (score, node, parent node, token) of every candidate
    frontier = [(0.0, -1, [])]  # (score, node, path tokens) of the nodes to expand next
    n = 0
    for level in range(depth):
        if level and extend is not None:  # a level costs a drafter step: only for nodes whose chance pays it
            frontier = [f for f in frontier if extend(level, float(np.exp(f[0])))]
            if not frontier:
                break
        grown = []
        for (score, node, toks), (ids, logps) in zip(frontier, expand([f[2] for f in frontier], top_k)):
            for t, lp in zip(ids, logps):
                scored.append((score + float(lp), n, node, int(t)))
                grown.append((score + float(lp), n, toks + [int(t)]))
                n += 1
        frontier = heapq.nlargest(top_k, grown, key=lambda g: (g[0], -g[1]))
    keep = heapq.nlargest(budget, scored, key=lambda s: (s[0], -s[1]))
    kept = {s[1] for s in keep}
    tree, index = DraftTree(), {}
    for score, node, parent, tok in sorted(scored, key=lambda s: s[1]):  # creation order: parents first
        if node in kept and (parent == -1 or parent in index):
            index[node] = tree.add(tok, index.get(parent, -1), score)
    return tree


def verify_tree_reference(target: Any, cache: Any, pending: int, tree: DraftTree,
                          vocab: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(root row (V,), node rows (N, V)): the target's logits after the context, and after the context and each node's
    path, one path at a time over `cache` (which holds the context but the pending token, and is left so)."""
    n0 = cache.length
    root = logits_rows(target([pending], cache), vocab)[-1].copy()
    cache.truncate(n0)
    rows = []
    for i in range(len(tree)):
        path = [tree.tokens[j] for j in tree.path(i)]
        rows.append(logits_rows(target([pending, *path], cache), vocab)[-1].copy())
        cache.truncate(n0)
    width = root.shape[0]
    return root, (np.stack(rows) if rows else np.zeros((0, width), dtype=root.dtype))


def accept_tree_greedy(tree: DraftTree, root_argmax: int, node_argmax: Sequence[int]) -> tuple[list[int], int]:
    """(accepted node indices root to leaf, the next token): follow the child carrying the target's argmax at each
    step; the argmax where no child carries it is the round's last token."""
    accepted, node, nxt = [], -1, int(root_argmax)
    while True:
        child = next((c for c in tree.children(node) if tree.tokens[c] == nxt), None)
        if child is None:
            return accepted, nxt
        accepted.append(child)
        node, nxt = child, int(node_argmax[child])


def tree_generate_reference(target: Any, topk: TopK, prompt_ids: Sequence[int], max_new_tokens: int, top_k: int = 2,
                            depth: int = 3, budget: int = 6, vocab: int | None = None) -> tuple[list[int], list[int]]:
    """Greedy speculative generation with draft trees and the reference verify: (tokens, accepted nodes a round)."""
    prompt = [int(t) for t in prompt_ids]
    cache = target.new_cache(len(prompt) + max_new_tokens + depth + 1)
    if len(prompt) > 1:
        target(prompt[:-1], cache)
    context, out, per_round = list(prompt), [], []
    while len(out) < max_new_tokens:
        tree = build_tree(topk, context, top_k, depth, budget)
        root, rows = verify_tree_reference(target, cache, context[-1], tree, vocab)
        accepted, nxt = accept_tree_greedy(tree, int(np.argmax(root)), [int(np.argmax(r)) for r in rows])
        new = [tree.tokens[i] for i in accepted] + [nxt]
        new = new[:max_new_tokens - len(out)]
        target([context[-1], *new[:-1]], cache)  # the verified prefix (a fast path keeps these rows' KV instead)
        context += new
        out += new
        per_round.append(len(accepted))
    return out, per_round
