"""Draft trees, the reference (minitorch/generation/tree.py): greedy generation with trees equals the target alone's
whatever the draft; the walk follows children only (a walk that takes a sibling's token, a node of the same depth under
another parent, changes the output and is caught); EAGLE-2's selection keeps the `budget` best-scoring candidates of
a brute-force enumeration, parents first; a tree accepts more than the chain of the same drafter."""
from __future__ import annotations

import numpy as np
import pytest

from minitorch.generation import generate
from minitorch.generation.tree import DraftTree, accept_tree_greedy, build_tree, tree_generate_reference
from test_generation_fakes import FakeModel


def topk_of(draft: FakeModel):
    """The draft's k most probable next tokens and their log probabilities after a context (a fresh forward)."""
    def topk(ctx, k):
        row = np.asarray(draft(ctx, draft.new_cache(len(ctx)))[0, -1], dtype=np.float64)
        lp = row - (row.max() + np.log(np.exp(row - row.max()).sum()))
        ids = np.argsort(-lp, kind="stable")[:k]
        return [int(i) for i in ids], [float(lp[i]) for i in ids]
    return topk


PROMPT = [3, 1, 4, 1, 5]


@pytest.mark.parametrize("noise", [0.0, 0.6, 3.0])
@pytest.mark.parametrize("top_k, depth, budget", [(1, 4, 4), (2, 3, 6), (3, 4, 12)])
def test_tree_generation_equals_the_target_alone(noise, top_k, depth, budget):
    target = FakeModel(24, seed=1)
    draft = target if noise == 0.0 else FakeModel(24, seed=1, like=target, noise=noise)
    want = generate(target, PROMPT, 40).tokens
    got, per_round = tree_generate_reference(target, topk_of(draft), PROMPT, 40, top_k, depth, budget)
    assert got == want
    if noise == 0.0:  # the target drafting for itself: every round accepts a whole path of the tree
        assert all(n == depth for n in per_round[:-1])


def test_the_walk_follows_children():
    """Root children a=7, b=9; a's child c=5; b's child d=5. Target argmax: root -> 9, after b -> 5, after d -> 2:
    accepted b, d, then 2. Where the root's argmax is 8 (no child carries it): nothing accepted, 8 emitted."""
    tree = DraftTree()
    a, b = tree.add(7, -1), tree.add(9, -1)
    c, d = tree.add(5, a), tree.add(5, b)
    node_argmax = {a: 1, b: 5, c: 3, d: 2}
    assert accept_tree_greedy(tree, 9, [node_argmax[i] for i in range(4)]) == ([b, d], 2)
    assert accept_tree_greedy(tree, 8, [node_argmax[i] for i in range(4)]) == ([], 8)
    assert accept_tree_greedy(tree, 7, [node_argmax[i] for i in range(4)]) == ([a], 1)
    with pytest.raises(ValueError):
        DraftTree(tokens=[1, 2], parents=[1, -1])  # a parent after its child


def test_a_walk_that_takes_a_siblings_token_is_caught(monkeypatch):
    """The broken variant: the walk looks for the target's token among all nodes one level deeper (a node attending
    to a sibling's branch), not the current node's children. The tokens it then emits are no longer the target's."""
    def same_depth(self, i):
        level = 1 if i == -1 else self.depth(i) + 1
        return [j for j in range(len(self.tokens)) if self.depth(j) == level]

    target = FakeModel(24, seed=2)
    draft = FakeModel(24, seed=2, like=target, noise=3.0)  # a draft whose top-1 is often wrong: siblings get used
    want = generate(target, PROMPT, 60).tokens
    assert tree_generate_reference(target, topk_of(draft), PROMPT, 60, 3, 4, 16)[0] == want
    monkeypatch.setattr(DraftTree, "children", same_depth)
    assert tree_generate_reference(target, topk_of(draft), PROMPT, 60, 3, 4, 16)[0] != want


def test_selection_keeps_the_best_candidates_parents_first():
    """build_tree against a brute-force enumeration of the same expansion: every candidate's score is its path's
    summed log probability; the tree holds the `budget` best (ties by creation order), each after its parent."""
    draft = FakeModel(12, seed=4)
    topk = topk_of(draft)
    ctx, k, depth, budget = [2, 7], 2, 3, 5
    cands, frontier = [], [(0.0, [])]
    for _ in range(depth):
        grown = []
        for score, toks in frontier:
            ids, lps = topk(ctx + toks, k)
            grown += [(score + lp, toks + [t]) for t, lp in zip(ids, lps)]
        cands += grown
        frontier = sorted(grown, key=lambda g: -g[0])[:k]
    best = sorted(cands, key=lambda c: -c[0])[:budget]
    tree = build_tree(topk, ctx, k, depth, budget)
    paths = sorted(tuple(tree.tokens[j] for j in tree.path(i)) for i in range(len(tree)))
    assert paths == sorted(tuple(p) for _, p in best)
    assert all(p < i for i, p in enumerate(tree.parents))
    chain = build_tree(topk, ctx, 1, 4, 4)  # top_k 1: the draft's greedy chain
    assert chain.parents == [-1, 0, 1, 2]


def test_a_tree_accepts_more_than_the_chain_of_the_same_drafter():
    target = FakeModel(24, seed=2)
    draft = FakeModel(24, seed=2, like=target, noise=3.0)
    _, chain = tree_generate_reference(target, topk_of(draft), PROMPT, 80, 1, 4, 4)
    _, tree = tree_generate_reference(target, topk_of(draft), PROMPT, 80, 3, 4, 16)
    assert sum(tree) / len(tree) > sum(chain) / len(chain)


def test_pruning_keeps_whole_branches_and_renumbers():
    """pruned(keep): a node stays only with its whole path; the kept nodes are renumbered parents first, scores kept."""
    tree = DraftTree()
    a = tree.add(7, -1, -0.1)
    b = tree.add(9, -1, -0.5)
    c = tree.add(5, a, -0.3)
    tree.add(6, b, -0.9)  # d: its parent b is dropped below, so d goes too
    tree.add(8, c, -2.0)  # e: dropped on its own
    kept = tree.pruned(lambda i: i in (a, c, 3))
    assert (kept.tokens, kept.parents, kept.scores) == ([7, 5], [-1, 0], [-0.1, -0.3])
    with pytest.raises(ValueError):
        tree.add(4, -1)  # a scored tree takes scored nodes only
