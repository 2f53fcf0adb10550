"""The GPU draft-tree engine's host logic (minitorch/generation/cuda_tree.py) on the CPU, greedy, over the fakes of
tests/test_generation_cuda_host.py: a target whose "KV cache" is the token at each position and whose next token is a
function of the last two, and a draft head of the same kind whose top-k list puts its own choice first and the
target's second (so alternatives are accepted often). The tree kernels (kernels/tree.cu tree_alternatives,
tree_accept, tree_keep, tree_advance, topk_part_f32, topk_merge_f32) are Python ports here, written from their
comments; the kernels themselves are held to the decode step and numpy on the GPU (tests/test_cuda_tree.py). What this
checks is the engine: the rows a round verifies, positions, the head's first step after a round, emission, the stats.
"""
from __future__ import annotations

import numpy as np
import pytest

from minitorch.cuda.decoder import TreeTables
from types import SimpleNamespace

from test_generation_cuda_host import FAKE_CP, PROMPT, TARGET, V, Arr, FakeDecoder, Launcher, arr, greedy, table

# CuPy's array makers too, for the engine's own buffers (the tree tables, the head's top-k lists)
TREE_CP = SimpleNamespace(cuda=FAKE_CP.cuda, zeros=lambda shape, dtype: np.zeros(shape, dtype).view(Arr),
                          empty=lambda shape, dtype: np.zeros(shape, dtype).view(Arr),
                          asarray=lambda a: np.asarray(a).view(Arr), int64=np.int64, int32=np.int32, float32=np.float32)


class TreeLauncher(Launcher):
    @staticmethod
    def tree_alternatives(tokens, lists, K, g, parents, T):
        taken = {}  # depth -> the list entries its earlier alternatives took
        for r in range(int(g) + 1, int(T)):
            d = int(parents[r]) + 1
            others = [t for t in lists[d - 1][:int(K)] if t != tokens[d]]
            k = taken.get(d, 0)
            tokens[r] = others[k] if k < len(others) else tokens[d]
            taken[d] = k + 1

    @staticmethod
    def tree_accept(nxt, tokens, parents, T, path, out):
        cur = n = 0
        while True:
            want = int(nxt[cur])
            c = next((r for r in range(cur + 1, int(T)) if parents[r] == cur and tokens[r] == want), -1)
            if c < 0:
                break
            n += 1
            path[n], out[n], cur = c, want, c
        path[0] = out[0] = n
        out[n + 1] = nxt[cur]

    def tree_keep(self, kv, L2, pos, path, Hkv, max_len, D, xn, H):
        dec, n, base = self.dec, int(path[0]), int(pos[0])
        for i in range(1, n + 1):
            dec.seq[base + i] = dec.seq[base + int(path[i])]
            xn[i] = xn[int(path[i])]

    @staticmethod
    def tree_advance(pos, tokens, out):
        n = int(out[0])
        pos[0] += n + 1
        tokens[0] = out[n + 1]

    @staticmethod
    def topk_part_f32(logits, V, K, chunk, pv, pi):
        V, K, chunk = int(V), int(K), int(chunk)
        for b in range(-(-V // chunk)):  # the grid: a block a chunk
            ids = np.arange(b * chunk, min(V, (b + 1) * chunk))
            best = ids[np.lexsort((ids, -np.asarray(logits)[ids]))][:K]
            pv[b * K:(b + 1) * K] = -np.inf
            pi[b * K:(b + 1) * K] = 2 ** 31 - 1
            pv[b * K:b * K + len(best)] = np.asarray(logits)[best]
            pi[b * K:b * K + len(best)] = best

    @staticmethod
    def topk_merge_f32(pv, pi, n, K, out):
        v, i = np.asarray(pv[:int(n)]), np.asarray(pi[:int(n)])
        out[:int(K)] = i[np.lexsort((i, -v))][:int(K)]


class TreeTarget(FakeDecoder):
    """A FakeDecoder with tree steps: row r predicts from the cache below the tree's position and its own path."""

    def __init__(self, tab, **kw):
        super().__init__(tab, **kw)
        self.k, self.cp = TreeLauncher(self), TREE_CP
        self.xn = arr(self.max_tokens)  # a row's "feature": the position its token was verified at
        self.gemv, self.D, self._tables = "tc", 64, {}
        self.H = self.Hkv = self.L = self.D_ = 1

    def tree_unsupported(self, T):
        return None if 1 <= T <= 16 else f"{T} rows"

    def tree_tables(self, parents):
        if parents not in self._tables:
            t = TreeTables(np, parents)
            t.parents, t.path = t.parents.view(type(self.tokens)), arr(t.T + 1, np.int32)
            self._tables[parents] = t
        return self._tables[parents]

    def tree_step(self, tables):
        p = int(self.pos[0])
        T = tables.T
        self.seq[p:p + T] = self.tokens[:T]
        for r in range(T):
            path = [int(self.tokens[i]) for i in tables.anc[r, :tables.depth_host[r] + 1]]
            ctx = list(self.seq[:p]) + path
            self.next_ids[r] = int(self.tab[ctx[-2], ctx[-1]]) if len(ctx) >= 2 else int(self.tab[0, ctx[-1]])
            self.xn[r] = p + tables.depth_host[r]
        self.steps.append(T)

    def tree_keep(self, tables):
        self.k.tree_keep(None, 0, self.pos, tables.path, 0, 0, 0, self.xn, 0)
        self.k.tree_advance(self.pos, self.tokens, self.spec_out)

    def prefill(self, ids, after_chunk=None):
        super().prefill(ids)
        if after_chunk is not None:
            self.xn[:len(ids)] = np.arange(len(ids))
            after_chunk(0, len(ids))


class FakeHead:
    """A draft head over a TreeTarget: its context is the target's verified tokens (read at a "round" step, as the
    real head reads their features) and then its own drafts; its next token is tab's; its logits rank its own token
    first, the target's second."""

    head_vocab = V

    def __init__(self, target, tab, max_tokens=16):
        self.target, self.tab = target, tab
        self.V = self.nv = V
        self.config, self.cp = target.config, target.cp
        self.max_len, self.max_tokens = target.max_len, max_tokens
        self.stream, self.k = target.stream, TreeLauncher(self)
        self.history, self.pos, self.tokens = arr(self.max_len + 16), arr(1, np.int32), arr(max_tokens)
        self.logits = np.zeros(V, np.float32)
        self.ctx: list[int] = []
        self.graphs: dict = {}
        self.sampling, self.probs, self.feeds = None, None, []

    def share_stream(self, other):
        self.stream = other.stream

    def limit_vocab(self, n):
        self.nv = n

    def set_sampling(self, temperature=0.0, top_k=0, top_p=1.0, seed=0):
        assert temperature == 0.0

    def set_position(self, p):
        self.pos[0] = p

    def feed_rows(self, feats, ids):
        pass

    def set_feature(self, row, token):
        t = self.target
        self.ctx = list(t.seq[:int(t.pos[0])]) + [int(token)]

    def feed(self, source, T):
        t = self.target
        if source == "round":  # the verified tokens and the pending one
            self.ctx = list(t.seq[:int(t.pos[0])]) + [int(t.tokens[0])]
        a, b = self.ctx[-2], self.ctx[-1]
        own, theirs = int(self.tab[a, b]), int(t.tab[a, b])
        self.logits[:] = 0.0
        self.logits[(own + 1) % V] = 1.0
        self.logits[theirs] = 2.0
        self.logits[own] = 3.0
        self.ctx.append(own)
        self.pos[0] += 1
        self.history[int(self.pos[0])] = own
        self.feeds.append((source, T))


def _run(head_tab, tree, n=60, prompt=PROMPT):
    from minitorch.generation.cuda import HeadGpuDrafter
    from minitorch.generation.cuda_tree import tree_speculative_generate_cuda

    target = TreeTarget(TARGET)
    head = FakeHead(target, head_tab)
    res = tree_speculative_generate_cuda(target, HeadGpuDrafter(head), prompt, n, *tree)
    return res, target, head


@pytest.mark.parametrize("tree", [(3, 4, 12), (2, 3, 5), (4, 2, 8), (1, 4, 4), (8, 5, 15)])
@pytest.mark.parametrize("head_kind", ["same", "close", "far"])
def test_tree_rounds_give_the_targets_greedy_text(tree, head_kind):
    head_tab = {"same": TARGET, "close": table(2, like=TARGET, noise=0.3), "far": table(3)}[head_kind]
    res, target, head = _run(head_tab, tree)
    assert res.tokens == greedy(TARGET, PROMPT, 60)
    st = res.stats
    assert st["new_tokens"] == 60 and max(st["per_round_nodes"]) <= tree[2]
    assert max(target.steps) <= 1 + min(tree[2], tree[0] * tree[1])
    if head_kind == "same":  # every chain token is right: each round but the short last ones keeps its whole chain
        assert st["accepted"] >= 60 - 2 * st["rounds"]
    if head_kind == "far" and tree[0] > 1:  # alternatives (the target's token, second on the head's list) are kept
        assert st["accepted"] > 0


def test_alternatives_gain_over_the_chain():
    """With a head that is often wrong but has the target's token second, a tree with alternatives keeps more
    tokens a round than the chain (top_k 1) of the same depth."""
    head_tab = table(2, like=TARGET, noise=0.5)
    chain, _, _ = _run(head_tab, (1, 4, 4))
    tree, _, _ = _run(head_tab, (3, 4, 12))
    assert chain.tokens == tree.tokens == greedy(TARGET, PROMPT, 60)
    assert tree.stats["rounds"] < chain.stats["rounds"]


def test_one_token_prompt_and_short_runs():
    head_tab = table(2, like=TARGET, noise=0.3)
    for n in (1, 2, 3, 5):
        res, _, _ = _run(head_tab, (3, 4, 12), n=n)
        assert res.tokens == greedy(TARGET, PROMPT, n)
    res, _, head = _run(head_tab, (3, 4, 12), n=20, prompt=[4])
    seq = [4]
    want = greedy(TARGET, [0, 4], 20)  # a one-token context predicts from (0, token), as the fake target does
    assert res.tokens == want and head.feeds[0][0] == "round"  # no feature for the first round: it drafts nothing


def test_a_walk_that_ignores_alternatives_is_caught(monkeypatch):
    """Power: a tree_accept that only follows the chain (the first child) still gives the target's text, but keeps no
    alternative, so it needs as many rounds as the chain."""
    def chain_only(nxt, tokens, parents, T, path, out):
        cur = n = 0
        while cur + 1 < int(T) and parents[cur + 1] == cur and tokens[cur + 1] == nxt[cur]:
            n, cur = n + 1, cur + 1
            path[n], out[n] = cur, tokens[cur]
        path[0] = out[0] = n
        out[n + 1] = nxt[cur]

    head_tab = table(2, like=TARGET, noise=0.5)
    good, _, _ = _run(head_tab, (3, 4, 12))
    monkeypatch.setattr(TreeLauncher, "tree_accept", staticmethod(chain_only))
    bad, _, _ = _run(head_tab, (3, 4, 12))
    chain, _, _ = _run(head_tab, (1, 4, 4))
    assert bad.tokens == good.tokens
    assert bad.stats["rounds"] == chain.stats["rounds"] > good.stats["rounds"]


def test_bad_tree_settings_are_one_clear_error():
    from minitorch.generation import SamplingConfig
    from minitorch.generation.cuda_tree import tree_speculative_generate_cuda

    target = TreeTarget(TARGET)
    head = FakeHead(target, TARGET)
    for kw, msg in [(dict(top_k=9), "at most 8"), (dict(budget=2, depth=4), "cover the chain"),
                    (dict(top_k=0), "top_k"), (dict(cfg=SamplingConfig(temperature=0.7)), "greedy")]:
        with pytest.raises(ValueError, match=msg):
            tree_speculative_generate_cuda(target, head, PROMPT, 10, **kw)


# -- a chain with prompt lookup first (--draft-lookup): HeadGpuDrafter.lookup_first, kernels/lookup.cu ngram_select

@pytest.mark.parametrize("lookup", [1, 2, 3])
@pytest.mark.parametrize("head_kind", ["same", "far"])
def test_lookup_first_chains_give_the_targets_greedy_text(lookup, head_kind):
    """The verify graph puts prompt lookup's tokens in the head's drafts' place where an n-gram of `lookup` or more
    matched: the text is still the target's, and a head that is always wrong ("far") gets drafts accepted from the
    lookup (the "language" repeats itself), which it never does without."""
    from minitorch.generation.cuda import HeadGpuDrafter, speculative_generate_cuda

    tab = {"same": TARGET, "far": table(3)}[head_kind]
    runs = {}
    for first in (0, lookup):
        target = TreeTarget(TARGET)
        res = speculative_generate_cuda(target, HeadGpuDrafter(FakeHead(target, tab), lookup_first=first), PROMPT, 60,
                                        gamma=4)
        assert res.tokens == greedy(TARGET, PROMPT, 60)
        runs[first] = res.stats
    if head_kind == "far":
        assert runs[lookup]["accepted"] > runs[0]["accepted"]


def test_a_select_over_a_context_that_does_not_grow_is_caught(monkeypatch):
    """The select reads the context kernels/lookup.cu context_append grows each round: with an append that never
    runs (the context stays the prompt) its tokens stop following the text, and a head that is always wrong gets
    few drafts accepted."""
    from minitorch.generation.cuda import HeadGpuDrafter, speculative_generate_cuda

    def run():
        target = TreeTarget(TARGET)
        res = speculative_generate_cuda(target, HeadGpuDrafter(FakeHead(target, table(3)), lookup_first=2), PROMPT,
                                        60, gamma=4)
        assert res.tokens == greedy(TARGET, PROMPT, 60)
        return res.stats["accepted"]

    good = run()
    monkeypatch.setattr(TreeLauncher, "context_append", staticmethod(lambda ctx, ctx_len, out, cap: None))
    broken = run()
    assert broken < good / 2


def test_lookup_first_is_greedy_only():
    from minitorch.generation.cuda import _verify

    target = TreeTarget(TARGET)
    target.sampling = object()
    with pytest.raises(ValueError, match="greedy only"):
        _verify(target, None, 2, 0, lookup=False, select=2)
