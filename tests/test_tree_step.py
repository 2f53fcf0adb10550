"""A tree step on the CPU (minitorch/models/tree_step.py, issue 44): every row of one target forward over a draft
tree gives the logits of a causal step over that row's own path (tree.py's reference verify), bit for bit, on the
one-call forward of a packed model; a chain is a plain step; after `keep_path` the cache is the one decoding the
accepted path would have left. Broken variants fail: a causal mask (a node seeing its siblings' branches) and
compaction that keeps the rejected rows' K/V."""
from __future__ import annotations

import numpy as np
import pytest

import minitorch
import minitorch.models.qwen2 as qwen2
from minitorch.generation.tree import DraftTree, verify_tree_reference
from minitorch.models import tree_step
from minitorch.models.tree_step import keep_path, tree_layout

pytest.importorskip("gguf")
pytest.importorskip("torch")
from test_models_util import packed_tiny_qwen2  # noqa: E402


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A tiny qwen2 GGUF (Q8_0, 256-wide rows) loaded packed: the CPU's one-call forward applies."""
    return packed_tiny_qwen2(tmp_path_factory.mktemp("tree_step"), seed=5)[0]


CONTEXT = [5, 17, 42, 8, 99, 23, 61, 7, 150, 31, 12]
# root children 0, 1, 2; 3 under 0; 4, 5 under 1; 6 under 3; 7 under 4; 8 under 6
TREE = DraftTree(tokens=[40, 41, 77, 12, 13, 14, 90, 91, 92], parents=[-1, -1, -1, 0, 1, 1, 3, 4, 6])


def step_parents(tree: DraftTree) -> list[int]:
    """The step's rows: the pending token (under the cache), then node i as row i + 1 under its parent's row."""
    return [-1] + [p + 1 for p in tree.parents]


def tree_rows(m, tree: DraftTree):
    cache = m.new_cache(64)
    with minitorch.no_grad():
        m(CONTEXT[:-1], cache)
        start = cache.length
        out = m([CONTEXT[-1], *tree.tokens], cache, parents=step_parents(tree)).to_numpy()[0]
    return out, cache, start


def test_layout_positions_and_mask_worked_by_hand():
    step = tree_layout([-1, 0, 0, 1, 2], 10)
    assert step.positions.tolist() == [10, 11, 11, 12, 12] and step.mask_from == 10
    assert step.mask.tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]]
    with pytest.raises(ValueError):
        tree_layout([-1, 2, 0], 0)


def test_every_row_of_a_tree_step_is_its_paths_own_step_bit_for_bit(model):
    rows, _, _ = tree_rows(model, TREE)
    cache = model.new_cache(64)
    with minitorch.no_grad():
        model(CONTEXT[:-1], cache)
        root, want = verify_tree_reference(model, cache, CONTEXT[-1], TREE)
    assert np.array_equal(rows[0], root)
    assert np.array_equal(rows[1:], want)


def test_a_chain_is_a_plain_step(model):
    chain = [40, 12, 90, 92]
    cache_a, cache_b = model.new_cache(64), model.new_cache(64)
    with minitorch.no_grad():
        model(CONTEXT[:-1], cache_a), model(CONTEXT[:-1], cache_b)
        a = model([CONTEXT[-1], *chain], cache_a, parents=[-1, 0, 1, 2, 3]).to_numpy()
        b = model([CONTEXT[-1], *chain], cache_b).to_numpy()
    assert np.array_equal(a, b)


def test_a_mask_that_lets_a_node_see_its_siblings_is_caught(model, monkeypatch):
    def causal(parents, start):
        step = tree_layout(parents, start)
        return tree_step.TreeStep(step.positions, np.tril(np.ones_like(step.mask)), start)

    monkeypatch.setattr(qwen2, "tree_layout", causal)
    rows, _, _ = tree_rows(model, TREE)
    cache = model.new_cache(64)
    with minitorch.no_grad():
        model(CONTEXT[:-1], cache)
        _, want = verify_tree_reference(model, cache, CONTEXT[-1], TREE)
    assert np.array_equal(rows[1], want[0])  # the root's first child sees only the pending token either way
    assert not np.allclose(rows[2:], want[1:], atol=1e-3)


@pytest.mark.parametrize("broken", [False, True])
def test_keep_path_leaves_the_cache_that_decoding_the_path_would(model, monkeypatch, broken):
    """Accept the path 1 -> 4 -> 7 (rows 2, 5, 8): the next step after keep_path equals the next step after decoding
    [pending, 41, 13, 91] causally. Broken: truncate without moving the rows' K/V (the rejected rows' stay)."""
    if broken:
        monkeypatch.setattr(tree_step, "keep_path", lambda cache, start, rows: cache.truncate(start + len(rows)))
    _, cache, start = tree_rows(model, TREE)
    path = TREE.path(7)
    assert path == [1, 4, 7]
    tree_step.keep_path(cache, start, [0] + [i + 1 for i in path])
    ref = model.new_cache(64)
    with minitorch.no_grad():
        model(CONTEXT[:-1], ref)
        model([CONTEXT[-1], *(TREE.tokens[i] for i in path)], ref)
        got = model([55], cache).to_numpy()
        want = model([55], ref).to_numpy()
    assert cache.length == ref.length
    assert np.array_equal(got, want) != broken


def test_keep_path_refuses_rows_out_of_order(model):
    _, cache, start = tree_rows(model, TREE)
    with pytest.raises(ValueError):
        keep_path(cache, start, [0, 5, 2])


def test_a_chain_shaped_step_is_causal_and_a_branching_one_is_not():
    """TreeStep.causal (cpu/decoder.py then runs the plain causal attention): a chain after any cache, a single row,
    a head's later level whose row sees the earlier levels' rows; not a branch, a row that skips a slot, or a row
    at a position other than the next."""
    TreeStep = tree_step.TreeStep
    assert tree_layout([-1, 0, 1, 2], 7).causal(7) and tree_layout([-1], 0).causal(0)
    assert not tree_layout([-1, 0, 0], 7).causal(7) and not tree_layout([-1, -1], 7).causal(7)
    assert TreeStep(np.array([9]), np.ones((1, 3), np.uint8), 7).causal(9)  # a level after two earlier rows
    assert not TreeStep(np.array([9]), np.array([[1, 0, 1]], np.uint8), 7).causal(9)  # not seeing a sibling
    assert not TreeStep(np.array([8]), np.ones((1, 3), np.uint8), 7).causal(9)  # a sibling's position
