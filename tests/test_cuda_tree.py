"""Draft trees on the CUDA-graph path (issue 44): CudaDecoder.tree_step (gemv.cu's *_qkvrope_tree_bf16, attention.cu's
attn_tree_partial_*), kernels/tree.cu and minitorch/generation/cuda_tree.py. The GPU tests:

(1) a tree step's row r has the logits of a causal step over its own path from the same position, bit for bit; a row
    made to read a sibling's branch (its ancestor table pointing there) does not, nor do rows of a kernel that reads
    the step's rows in slot order (cuda_helpers.BROKEN_KERNELS["attention_tree"]);
(2) the walk, the keep and the advance: with the target's own next token planted as an alternative at depth 1, the
    round keeps it, its K/V and hidden state land where a decode step puts them, and the next decode step agrees;
    skipping the keep (the rejected chain token's K/V left in place) is caught;
(3) greedy generation with a head's chain-with-leaves trees is the target alone's output, for several shapes, and the
    warm-up capture leaves nothing to capture inside a run;
(4) topk_f32 against numpy (ties to the lower index, so its first is argmax_final's), and the two-pass top-k the
    draft head's tree lists take (topk_part_f32 + topk_merge_f32) against numpy.

The host-side parts (the tree's shape and tables) run on the CPU too.
"""
from __future__ import annotations

import numpy as np
import pytest

from cuda_helpers import needs_gpu

# head sizes 64 (4 query heads over 2 kv heads) and 128: the tree attention's instantiations, as the batch tests'
from test_cuda_batch import BATCH_CONFIGS as CONFIGS  # noqa: E402

MAX_LEN = 160
PROMPTS = [[5, 17, 42, 8, 1, 30], [7], [3 + (i * 13) % 90 for i in range(37)]]
# rows under their parents: a chain with side branches (8 rows), and a bushy tree of 16 (the most a step verifies)
TREES = [(-1, 0, 1, 2, 0, 4, 1, 0), (-1, 0, 0, 0, 1, 1, 2, 4, 7, 8, 3, 10, 11, 12, 13, 5)]


def _path(parents, r):
    out = []
    while r != -1:
        out.append(r)
        r = parents[r] if r else -1
    return out[::-1]


# ------------------------------------------------------------------ host side (CPU)
def test_chain_with_leaves_shapes():
    from minitorch.generation.cuda_tree import chain_with_leaves

    assert chain_with_leaves(4, 3, 12) == ((-1, 0, 1, 2, 3, 0, 0, 1, 1, 2, 2, 3, 3), (2, 2, 2, 2))
    assert chain_with_leaves(4, 3, 7) == ((-1, 0, 1, 2, 3, 0, 0, 1), (2, 1, 0, 0))  # shallow depths first
    assert chain_with_leaves(3, 1, 9) == ((-1, 0, 1, 2), (0, 0, 0))  # top-1: the chain
    assert chain_with_leaves(2, 8, 15) == ((-1, 0, 1) + (0,) * 7 + (1,) * 6, (7, 6))  # 15 nodes: 16 rows
    with pytest.raises(ValueError, match="cover the chain"):
        chain_with_leaves(4, 3, 3)


def test_tree_tables_by_hand():
    from minitorch.cuda.decoder import TreeTables

    t = TreeTables(np, TREES[0])
    assert t.depth_host == (0, 1, 2, 3, 1, 2, 2, 1) and t.width == 4
    for r in range(t.T):  # row r's keys past the cache: its path from the root, then nothing it may read
        path = _path(TREES[0], r)
        assert list(t.anc[r, :len(path)]) == path
    with pytest.raises(ValueError, match="earlier row"):
        TreeTables(np, (-1, 0, 3, 1))
    with pytest.raises(ValueError, match="root"):
        TreeTables(np, (0, 0))


# ------------------------------------------------------------------ GPU
def _target(ci, seed=3):
    from minitorch import FastBackend
    from test_cuda_model import build, decoder_of

    model, w = build(CONFIGS[ci], FastBackend, seed=seed)
    return model, w, decoder_of(CONFIGS[ci], w, max_len=MAX_LEN, max_tokens=16, gemv="tc")


def _rows(dec, T):
    return dec.logits.ravel()[:T * dec.nv].reshape(T, dec.nv).get()


def _tree_logits(dec, prompt, parents, tokens, tables=None):
    dec.prefill(prompt)  # the cache holds the prompt; the tree's root sits at len(prompt)
    with dec.stream:
        dec.tokens[:len(tokens)].set(np.asarray(tokens, np.int64), stream=dec.stream)
        dec.tree_step(tables if tables is not None else dec.tree_tables(parents))
    dec.stream.synchronize()
    return _rows(dec, len(tokens)), dec.next_ids[:len(tokens)].get()


def _path_logits(dec, prompt, parents, tokens, r):
    """The last row of a causal step over row r's path, from the tree's position (the verify == decode rule)."""
    path = [tokens[i] for i in _path(parents, r)]
    dec.set_position(len(prompt))
    dec.run(path, all_logits=True, advance=False)
    dec.stream.synchronize()
    return _rows(dec, len(path))[-1]


@pytest.mark.parametrize("parents", TREES, ids=["8 rows", "16 rows"])
@pytest.mark.parametrize("ci", [0, 1], ids=["d64-gqa", "d128"])
@pytest.mark.gpu
@needs_gpu
def test_tree_rows_are_their_paths_causal_rows_bitwise(ci, parents):
    _, _, dec = _target(ci)
    r = np.random.default_rng(ci * 7 + len(parents))
    for prompt in PROMPTS:
        tokens = [int(t) for t in r.integers(1, CONFIGS[ci]["vocab_size"], len(parents))]
        tree, best = _tree_logits(dec, prompt, parents, tokens)
        for row in range(len(parents)):
            ref = _path_logits(dec, prompt, parents, tokens, row)
            np.testing.assert_array_equal(tree[row], ref, err_msg=f"row {row} of {parents}, prompt {len(prompt)}")
            assert int(best[row]) == int(np.argmax(ref))



@pytest.mark.gpu
@needs_gpu
def test_a_row_reading_a_siblings_branch_is_caught():
    from minitorch.cuda.decoder import TreeTables

    _, _, dec = _target(0)
    parents, prompt = TREES[0], PROMPTS[0]
    tokens = [11, 23, 5, 71, 9, 140, 33, 2]
    bad = TreeTables(dec.cp, parents)
    anc = bad.anc.get()
    anc[4, 1] = 1  # row 4 (under the root) reads row 1, its sibling, instead of itself
    bad.anc.set(anc)
    tree, _ = _tree_logits(dec, prompt, parents, tokens, tables=bad)
    ok = [np.array_equal(tree[row], _path_logits(dec, prompt, parents, tokens, row)) for row in range(len(parents))]
    assert not ok[4] and not ok[5]  # row 4 and its child see the wrong key
    assert ok[1] and ok[2] and ok[3]  # the branch it read is untouched


@pytest.mark.gpu
@needs_gpu
def test_tree_attention_reading_rows_in_slot_order_fails(monkeypatch):
    """Power of the row test: a kernel whose rows read the step's rows in slot order (siblings' keys past the root)
    instead of their own paths (cuda_helpers.BROKEN_KERNELS["attention_tree"])."""
    from cuda_helpers import use_broken_kernels

    use_broken_kernels(monkeypatch, "attention_tree")
    with pytest.raises(AssertionError):
        test_tree_rows_are_their_paths_causal_rows_bitwise(0, TREES[0])


def _plant(dec, prompt):
    """A tree whose chain token at depth 1 is wrong and whose alternative there is the target's token: (tokens,
    parents, a0, a1, a2): a0 the pending token, a1 and a2 the target's next two."""
    from minitorch.generation.cuda import generate_cuda

    a0, a1, a2 = generate_cuda(dec, prompt, 3).tokens
    x = (a1 + 1) % dec.nv
    return [a0, x, (x + 7) % dec.nv, a1], (-1, 0, 1, 0), a0, a1, a2


def _round(dec, prompt, tokens, parents):
    dec.prefill(prompt)  # the cache holds the prompt, position len(prompt); the root (a0) sits there
    P = len(prompt)
    tables = dec.tree_tables(parents)
    with dec.stream:
        dec.tokens[:len(tokens)].set(np.asarray(tokens, np.int64), stream=dec.stream)
        dec.tree_step(tables)
        dec.k.launch("tree_accept", (1,), (1,), (dec.next_ids, dec.tokens, tables.parents, np.int32(len(parents)),
                                                 tables.path, dec.spec_out))
        dec.tree_keep(tables)
    dec.stream.synchronize()
    return P, tables


def _check_kept(dec, ref, prompt, a0, a1, a2, P):
    for lw, rw in zip(dec.layers, ref.layers):
        for name in ("k", "v"):
            np.testing.assert_array_equal(lw[name][:, P:P + 2].get(), rw[name][:, P:P + 2].get())
    np.testing.assert_array_equal(dec.xn[1].get(), ref.xn[1].get())


def _planted_round():
    """A target after a round whose chain token was wrong and whose alternative was the target's (_plant, _round),
    and a reference decoder that decoded a0 and a1 after the prompt (rows P, P + 1 of its caches; xn rows 0, 1)."""
    from test_cuda_model import decoder_of

    _, w, dec = _target(0)
    ref = decoder_of(CONFIGS[0], w, max_len=MAX_LEN, max_tokens=16, gemv="tc")
    prompt = PROMPTS[0]
    tokens, parents, a0, a1, a2 = _plant(dec, prompt)
    ref.prefill(prompt)
    ref.run([a0, a1], all_logits=True, advance=True)
    ref.stream.synchronize()
    P, tables = _round(dec, prompt, tokens, parents)
    return dec, ref, prompt, (a0, a1, a2), P, tables


@pytest.mark.gpu
@needs_gpu
def test_an_accepted_alternative_is_kept_where_a_decode_step_puts_it():
    dec, ref, prompt, (a0, a1, a2), P, tables = _planted_round()
    assert list(dec.spec_out[:3].get()) == [1, a1, a2]
    assert list(tables.path[:2].get()) == [1, 3]  # the alternative's row
    assert int(dec.pos.get()[0]) == P + 2 and int(dec.tokens[0].get()) == a2
    _check_kept(dec, ref, prompt, a0, a1, a2, P)
    # the next step decodes from the kept path as from the reference's
    dec.replay(1, all_logits=False, advance=True)
    ref.run([a2], all_logits=False, advance=True)
    dec.stream.synchronize()
    ref.stream.synchronize()
    assert int(dec.next_ids[0].get()) == int(ref.next_ids[0].get())


@pytest.mark.gpu
@needs_gpu
def test_a_round_that_keeps_the_rejected_rows_is_caught(monkeypatch):
    from minitorch.cuda.decoder import CudaDecoder

    def advance_only(self, tables):  # the position moves, the rows do not
        self.k.launch("tree_advance", (1,), (1,), (self.pos, self.tokens, self.spec_out))

    monkeypatch.setattr(CudaDecoder, "tree_keep", advance_only)
    dec, ref, prompt, (a0, a1, a2), P, _ = _planted_round()
    assert list(dec.spec_out[:3].get()) == [1, a1, a2]  # the walk is right ...
    with pytest.raises(AssertionError):
        _check_kept(dec, ref, prompt, a0, a1, a2, P)  # ... but row P + 1 holds the chain's rejected token


def _head(model, target):
    from minitorch import FastBackend
    from minitorch.cuda.decoder import weights_from_model
    from minitorch.cuda.head import HeadDecoder
    from minitorch.models.draft_head import DraftHead, DraftHeadConfig

    head = DraftHead(DraftHeadConfig.for_target(model, head_vocab=64, intermediate_size=96), FastBackend, seed=3)
    hw = weights_from_model(head)
    hw["fc.weight"] = hw["fc.weight"] * 4
    return HeadDecoder(head.config, hw, target, gemv="ours")


@pytest.mark.parametrize("tree", [(2, 3, 5), (3, 4, 12), (4, 5, 15), (8, 2, 9), (1, 3, 3)])
@pytest.mark.gpu
@needs_gpu
def test_greedy_tree_generation_equals_the_target(tree):
    from minitorch.generation.cuda import HeadGpuDrafter, generate_cuda
    from minitorch.generation.cuda_tree import tree_speculative_generate_cuda

    model, _, target = _target(0)
    d = HeadGpuDrafter(_head(model, target))
    for prompt in PROMPTS:
        ref = generate_cuda(target, prompt, 40).tokens
        res = tree_speculative_generate_cuda(target, d, prompt, 40, *tree)
        assert res.tokens == ref, (tree, prompt)
        st = res.stats
        assert st["new_tokens"] == 40 and max(st["per_round_nodes"]) <= tree[2]
        assert st["draft_forwards"] <= st["rounds"] * tree[1]


@pytest.mark.gpu
@needs_gpu
def test_capture_covers_a_tree_runs_graphs():
    from minitorch.generation.cuda import HeadGpuDrafter
    from minitorch.generation.cuda_tree import capture_tree_graphs, tree_speculative_generate_cuda

    model, _, target = _target(0)
    hdec = _head(model, target)
    d = HeadGpuDrafter(hdec)
    capture_tree_graphs(target, d, PROMPTS[2], 3, 4, 12)
    keys, hkeys = set(target.graphs), set(hdec.graphs)
    for prompt in PROMPTS:
        tree_speculative_generate_cuda(target, d, prompt, 40, 3, 4, 12)
    assert set(target.graphs) == keys and set(hdec.graphs) == hkeys


@pytest.mark.gpu
@needs_gpu
def test_topk_matches_numpy_with_ties_to_the_lower_index():
    import cupy as cp

    from minitorch.cuda.runtime import kernels

    r = np.random.default_rng(5)
    for V, K in [(211, 3), (151936, 8), (64, 8), (1000, 1)]:
        x = r.standard_normal(V).astype(np.float32)
        x[V // 3] = x[V // 2] = x[V - 1] = x.max() + 1  # a three-way tie at the top
        out = cp.zeros(K, cp.int64)
        kernels().launch("topk_f32", (1,), (256,), (cp.asarray(x), np.int32(V), np.int32(K), out))
        want = np.lexsort((np.arange(V), -x))[:K]
        assert list(out.get()) == list(want), (V, K)


@pytest.mark.gpu
@needs_gpu
def test_two_pass_topk_is_topk_f32s_across_chunks():
    """The draft head's top-k lists (HeadGpuDrafter._top_k): topk_part_f32 over chunks of TOPK_CHUNK logits, then
    topk_merge_f32 over their lists, equal numpy's (and so topk_f32's) for a three-way tie at the top spread over three
    chunks and for a maximum in the last, partial chunk; a grid that leaves that chunk out (floor instead of ceil) is
    caught."""
    import cupy as cp

    from minitorch.cuda.runtime import kernels
    from minitorch.generation.cuda import TOPK_CHUNK

    def two_pass(x, K, nb):
        pv, pi, out = cp.empty(nb * K, cp.float32), cp.empty(nb * K, cp.int32), cp.zeros(K, cp.int64)
        i32 = np.int32
        kernels().launch("topk_part_f32", (nb,), (256,), (cp.asarray(x), i32(len(x)), i32(K), i32(TOPK_CHUNK), pv, pi))
        kernels().launch("topk_merge_f32", (1,), (256,), (pv, pi, i32(nb * K), i32(K), out))
        return list(out.get())

    r = np.random.default_rng(6)
    for V, K in [(32768, 3), (151936, 8), (1000, 5), (2049, 1)]:
        x = r.standard_normal(V).astype(np.float32)
        x[V // 3] = x[V // 2] = x[V - 1] = x.max() + 1  # a three-way tie at the top, in three chunks
        want = [int(i) for i in np.lexsort((np.arange(V), -x))[:K]]
        assert two_pass(x, K, -(-V // TOPK_CHUNK)) == want, (V, K)
        x[V - 1] += 1  # the maximum alone, in the last chunk (partial where V is not a multiple of the chunk)
        want = [int(i) for i in np.lexsort((np.arange(V), -x))[:K]]
        assert two_pass(x, K, -(-V // TOPK_CHUNK)) == want, (V, K)
        if V % TOPK_CHUNK and V > TOPK_CHUNK:  # (V < a chunk: the broken grid has no block, no launch)
            assert two_pass(x, K, V // TOPK_CHUNK) != want  # the broken grid never reads the last chunk


def _decode_rows(dec, prompt, tokens):
    """The logits of one-token decode steps over tokens after the prompt (the reference a verify row must equal)."""
    dec.prefill(prompt)
    rows = []
    for tok in tokens:
        dec.run([tok], all_logits=True, advance=True)
        dec.stream.synchronize()
        rows.append(_rows(dec, 1)[0])
    return np.stack(rows)


def _step_rows(dec, prompt, tokens):
    dec.prefill(prompt)
    dec.run(tokens, all_logits=True, advance=False)
    dec.stream.synchronize()
    return _rows(dec, len(tokens))


@pytest.mark.parametrize("T", [1, 2, 5, 9, 13, 16])
@pytest.mark.parametrize("ci", [0, 1], ids=["d64-gqa", "d128"])
@pytest.mark.gpu
@needs_gpu
def test_verify_rows_with_the_norm_in_its_own_kernel_are_decode_rows_bitwise(ci, T):
    """CudaDecoder.split_norm_from (StepPlan.split_norm): a step of T >= it tokens adds into the residual in the GEMV
    and normalises the rows in gemv_resnorm_rows_bf16 (a block a row) instead of the resnorm epilogue's last block;
    each row's logits are still those of a one-token decode step with the epilogue at its position, bit for bit."""
    _, _, dec = _target(ci)
    prompt = PROMPTS[2]
    tokens = [int(t) for t in np.random.default_rng(T + ci).integers(1, CONFIGS[ci]["vocab_size"], T)]
    dec.split_norm_from = None
    ref = _decode_rows(dec, prompt, tokens)
    dec.split_norm_from = 1
    assert dec._plan(T).split_norm
    np.testing.assert_array_equal(_step_rows(dec, prompt, tokens), ref)


@pytest.mark.gpu
@needs_gpu
def test_a_split_norm_of_another_block_size_is_caught(monkeypatch):
    """Power of the test above: the row kernel launched with 128 threads (another reduction, half of each row read)
    does not give the decode step's rows."""
    _, _, dec = _target(1)
    prompt, T = PROMPTS[2], 13
    tokens = [int(t) for t in np.random.default_rng(5).integers(1, CONFIGS[1]["vocab_size"], T)]
    dec.split_norm_from = None
    ref = _decode_rows(dec, prompt, tokens)
    launch = dec.k.launch

    def broken(name, grid, block, args, *rest, **kw):
        return launch(name, grid, (128,) if name == "gemv_resnorm_rows_bf16" else block, args, *rest, **kw)

    monkeypatch.setattr(dec.k, "launch", broken)
    dec.split_norm_from = 9
    assert not np.array_equal(_step_rows(dec, prompt, tokens), ref)
