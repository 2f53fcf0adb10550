"""Draft trees on the CPU engine (minitorch/generation/tree_decoding.py, issue 44), on a tiny packed target (the one-call
forward takes tree steps): greedy output equals the target alone's for several tree shapes, with a real draft head
(HeadDrafter.propose_tree) and with an oracle drafter whose accepted paths run through second children (so the kept
path's K/V rows must move); the head's one-step-a-level tree equals expanding each path on its own; compaction that
keeps the rejected rows' K/V is caught."""
from __future__ import annotations

import numpy as np
import pytest

import minitorch
from minitorch.generation import generate
from minitorch.generation import tree_decoding as td
from minitorch.generation.budget import CostBudget
from minitorch.generation.head_drafter import HeadDrafter, top_logprobs
from minitorch.generation.tree import build_tree
from minitorch.models.draft_head import DraftHead, DraftHeadConfig

pytest.importorskip("gguf")
pytest.importorskip("torch")
from test_models_util import packed_tiny_qwen2  # noqa: E402

PROMPT = [5, 17, 42, 8, 99, 23, 61, 7]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target, _ = packed_tiny_qwen2(tmp_path_factory.mktemp("tree_decoding"), seed=6)
    head = DraftHead(DraftHeadConfig.for_target(target, head_vocab=256, intermediate_size=128), target.backend,
                     seed=3).packed()
    return target, head


def started(target, head, context, prompt_window=0):
    d = HeadDrafter(head, target, prompt_window=prompt_window)
    cache = target.new_cache(64)
    with minitorch.no_grad():
        feats = target(context[:-1], cache, last_n=1, return_hidden=True)[1]
        d.start(context, 64)
        d.observe(feats)
    return d


def test_the_heads_tree_equals_expanding_each_path_alone(pair):
    """Reference: a fresh head per path, its catch-up step then one 1-row step per token of the path (the chain's
    steps); the tree of one head step a level has the same tokens and parents."""
    target, head = pair

    def topk(ctx, k):
        d = started(target, head, PROMPT)
        with minitorch.no_grad():
            n = len(PROMPT)
            g, row = d._step(minitorch.from_numpy(d._feats[:n - 1][None], backend=head.backend), PROMPT[1:n])
            for tok in ctx[n:]:
                g, row = d._step(g, [tok])
        return top_logprobs(row, k)

    for top_k, depth, budget in ((3, 3, 8), (2, 4, 7), (1, 3, 3)):
        d = started(target, head, PROMPT)
        with minitorch.no_grad():
            got = d.propose_tree(PROMPT, top_k, depth, budget)
        want = build_tree(topk, PROMPT, top_k, depth, budget)
        assert (got.tokens, got.parents) == (want.tokens, want.parents)
        assert d.cache.length == len(PROMPT) - 1  # trimmed back to the verified prefix


def test_a_windowed_heads_tree_equals_a_fresh_head_over_the_window(pair):
    """HeadDrafter(prompt_window=W): the tree's nodes sit at positions counted from the window's first row (its cache's),
    so the tree equals expanding each path with a fresh head over the window's features alone (positions from 0)."""
    target, head = pair
    n, w = len(PROMPT), 4
    b = n - 2 - w  # the prefill's features are the context's but its pending token's: n - 1 of them, the window their last w
    assert b > 0

    def windowed():
        return started(target, head, PROMPT, prompt_window=w)

    def topk(ctx, k):
        d = windowed()
        d.cache = head.new_cache(64)  # a fresh head over the window: f_b..f_{n-2}, tokens b+1..n-1, positions from 0
        with minitorch.no_grad():
            g, row = d._step(minitorch.from_numpy(d._feats[b:n - 1][None], backend=head.backend), PROMPT[b + 1:n])
            for tok in ctx[n:]:
                g, row = d._step(g, [tok])
        return top_logprobs(row, k)

    d = windowed()
    assert d._base == b and d.cache.length == w
    with minitorch.no_grad():
        got = d.propose_tree(PROMPT, 3, 3, 8)
    want = build_tree(topk, PROMPT, 3, 3, 8)
    assert (got.tokens, got.parents) == (want.tokens, want.parents)
    np.testing.assert_allclose(got.scores, want.scores, rtol=1e-5, atol=1e-5)  # the nodes' log probabilities too
    assert d.cache.length == n - 1 - b


@pytest.mark.parametrize("top_k, depth, budget", [(1, 3, 3), (2, 3, 6), (4, 4, 12)])
def test_tree_decoding_with_the_head_equals_the_target_alone(pair, top_k, depth, budget):
    target, head = pair
    want = generate(target, PROMPT, 40).tokens
    res = td.tree_speculative_generate(target, HeadDrafter(head, target), PROMPT, 40, top_k, depth, budget)
    assert res.tokens == want
    assert res.stats["rounds"] < 40 or top_k == 1  # (a random head is seldom right)


class StatelessTreeDrafter:
    """A tree drafter with no state of its own: the drafter protocol's start / observe / rollback do nothing; its chain
    (the draft budget's chain rounds) is the tree of its first choices, kept as the gate says, as a head's is."""

    forwards = 0

    def propose(self, tokens, gamma, cfg, rng, gate=None):
        tree = self.propose_tree(tokens, 1, gamma, gamma, extend=gate.extend if gate is not None else None)
        if gate is not None:
            tree = tree.pruned(lambda i: gate.include(tree.depth(i), float(np.exp(tree.scores[i]))))
        return list(tree.tokens), None

    def start(self, prompt, max_len, vocab=None):
        pass

    def observe(self, feats):
        pass

    def rollback(self, n):
        pass


class Oracle(StatelessTreeDrafter):
    """A tree drafter from the target's own next-token ranking, its first two swapped at every other depth: accepted
    paths run through second children, so the rows to keep are not the first ones."""

    def __init__(self, target):
        self.target = target

    def propose_tree(self, tokens, top_k, depth, budget, extend=None):
        def topk(ctx, k):
            with minitorch.no_grad():
                row = self.target(list(ctx), self.target.new_cache(len(ctx))).to_numpy()[0, -1]
            ids, lps = top_logprobs(row, max(k, 2))
            if (len(ctx) - len(tokens)) % 2 == 0:
                ids[0], ids[1] = ids[1], ids[0]
                lps[0], lps[1] = lps[1], lps[0]
            return ids[:k], lps[:k]
        return build_tree(topk, tokens, top_k, depth, budget, extend)


@pytest.mark.parametrize("broken", [False, True])
def test_kept_paths_through_second_children_and_broken_compaction(pair, monkeypatch, broken):
    target, _ = pair
    kept = []
    real = td.keep_path

    def keep(cache, start, rows):
        kept.append(list(rows))
        if broken:  # the cache cut after the path's length, its rows left where the tree step wrote them
            return cache.truncate(start + len(rows))
        return real(cache, start, rows)

    monkeypatch.setattr(td, "keep_path", keep)
    want = generate(target, PROMPT, 30).tokens
    res = td.tree_speculative_generate(target, Oracle(target), PROMPT, 30, top_k=2, depth=3, budget=6)
    assert (res.tokens == want) != broken
    if not broken:  # whole paths accepted, whose rows are not the step's first ones
        assert res.stats["accepted"] >= 15 and any(rows != list(range(len(rows))) for rows in kept)


def test_trees_refuse_sampling_and_a_drafter_without_trees(pair):
    from minitorch.generation import ModelDrafter, SamplingConfig

    target, head = pair
    with pytest.raises(ValueError, match="greedy"):
        td.tree_speculative_generate(target, HeadDrafter(head, target), PROMPT, 8, cfg=SamplingConfig(temperature=1.0))
    with pytest.raises(ValueError, match="propose_tree"):
        td.tree_speculative_generate(target, ModelDrafter(target), PROMPT, 8)
    with pytest.raises(ValueError, match="budget"):
        td.tree_speculative_generate(target, HeadDrafter(head, target), PROMPT, 8, budget=0)


@pytest.mark.parametrize("drafter", ["head", "oracle"])
def test_gated_trees_equal_the_target_alone(pair, drafter):
    """The draft budget on trees (adaptive "cost"): each tree pruned to the nodes whose path probability pays a verify
    row, rounds plain where drafting does not pay; the output is still the target's."""
    target, head = pair
    d = HeadDrafter(head, target) if drafter == "head" else Oracle(target)
    want = generate(target, PROMPT, 40).tokens
    res = td.tree_speculative_generate(target, d, PROMPT, 40, top_k=3, depth=3, budget=9, adaptive="cost")
    assert res.tokens == want and "plain_rounds" in res.stats


def test_the_gate_prunes_a_tree_to_the_nodes_whose_chance_pays_a_row(pair):
    """A gated budget whose rows cost 0.2 of a step (draft steps free) and that always drafts: every verified node's
    path probability under the drafter is at least 0.2, the output is the target's."""
    class Fixed(CostBudget):
        def choose(self, accepted, judged):
            self.choices.append(self.gamma)
            return self.gamma

        def row_share(self):
            return 0.2

        def draft_share(self):
            return 0.0

    target, _ = pair
    oracle, seen = Oracle(target), []
    propose = oracle.propose_tree

    def spy(*a, **kw):
        tree = propose(*a, **kw)
        seen.append(sorted(np.exp(tree.scores)))
        return tree

    oracle.propose_tree = spy
    want = generate(target, PROMPT, 30).tokens
    res = td.tree_speculative_generate(target, oracle, PROMPT, 30, top_k=3, depth=3, budget=9,
                                       adaptive=Fixed(3, gated=True))
    assert res.tokens == want
    kept = sum(res.stats["per_round_nodes"])
    assert 0 < kept < sum(len(p) for p in seen)  # some nodes were cut, some kept
    assert kept == sum(sum(1 for p in probs if p >= 0.2) for probs in seen)  # exactly those whose chance pays


def run_shapes(choice, costs, rounds):
    """Drive a ShapeChoice for `rounds` rounds, costs(tree) = (seconds, tokens) of a round; the shapes chosen."""
    chosen = []
    for i in range(rounds):
        tree = choice.tree()
        chosen.append(tree)
        choice.record(tree, *costs(i, tree))
    return chosen


def test_the_shape_choice_takes_the_cheaper_shape_and_rechecks_the_other():
    """Warm-up rounds in turn, then the shape with fewer seconds a token, the other once after every RECHECK rounds of
    it; when the costs turn, the choice follows within a recheck or two."""
    choice = td.ShapeChoice(warm=3, recheck=12)
    tree_dear = lambda i, tree: (3.0, 3) if tree else (1.0, 2)  # noqa: E731  tree 1 s a token, chain 0.5
    chosen = run_shapes(choice, tree_dear, 60)
    assert chosen[:7] == [True, True, False, True, False, True, False]  # the run's warm-up round, then 3 each in turn
    after = chosen[7:]
    assert after[:12] == [False] * 12 and after[12] is True  # the cheaper chain, then one tree
    assert sum(after) == len(after) // 13  # one tree a RECHECK + 1 rounds
    # the tree turns cheap (0.25 s a token): the next recheck sees it, and the running means follow
    turned = run_shapes(choice, lambda i, tree: (1.0, 4) if tree else (1.0, 2), 100)
    assert sum(turned[:13]) == 1  # one recheck does not outweigh the running mean
    assert sum(turned[-26:]) == 24  # it has turned: the tree, and the chain once after every 12 of it


def test_the_shape_choice_keeps_the_chain_when_the_tree_is_no_cheaper_beyond_the_noise(monkeypatch):
    """Rounds as the Zen 3 box's (tools/cpu_round_costs.py on GSM8K): a tree round 93.7 ms for 2.39 tokens on
    average, a chain round 81.3 ms for 2.21, so the tree 6.5% dearer a token, each round emitting 1-5 tokens at random.
    The chain is kept but for the rechecks (1 in 13 rounds) and a few more; the running means alone, ~9 rounds each,
    took the tree in about a third of the rounds (36% measured)."""
    def cpu_rounds(seed):
        rng = np.random.default_rng(seed)

        def costs(i, tree):
            n = 1 + int(rng.binomial(4, 0.3475 if tree else 0.3025))  # 2.39 and 2.21 tokens a round on average
            return ((0.0937 if tree else 0.0813) * (1 + 0.05 * rng.standard_normal()), n)
        return costs

    def tree_share(seed):
        return sum(run_shapes(td.ShapeChoice(warm=3, recheck=12), cpu_rounds(seed), 1000)[100:]) / 900

    assert all(tree_share(seed) < 0.12 for seed in range(3))
    monkeypatch.setattr(td, "SHAPE_Z", 0.0)  # broken: the means alone decide
    assert all(tree_share(seed) > 0.25 for seed in range(3))


class Always(CostBudget):
    """A gated budget whose every round drafts, every node and draft kept (the gate's own pruning and growing are
    tested apart)."""

    def choose(self, accepted, judged):
        self.choices.append(self.gamma)
        return self.gamma

    def include(self, n, p):
        return True

    def extend(self, n, p):
        return True


class Scripted(StatelessTreeDrafter):
    """A tree drafter that knows the target's greedy text and costs nothing of its own: its first choice at a round's
    first depth is wrong and its second right, its first choice deeper right. A chain (top_k 1) so emits one token a
    round, a tree more (3 at top_k 2, depth 3, budget 6)."""

    def __init__(self, text, vocab):
        self.text, self.vocab = list(text), vocab

    def propose_tree(self, tokens, top_k, depth, budget, extend=None):
        def topk(ctx, k):
            ctx = list(ctx)
            right = self.text[len(ctx)] if ctx == self.text[:len(ctx)] and len(ctx) < len(self.text) else 0
            wrong = (right + 1) % self.vocab
            ids = [wrong, right] if len(ctx) == len(tokens) else [right, wrong]
            return np.array(ids[:k]), np.log(np.array([0.6, 0.4][:k]))
        return build_tree(topk, tokens, top_k, depth, budget, extend)


@pytest.mark.parametrize("broken", [False, True])
@pytest.mark.parametrize("dear", ["tree", "chain"])
def test_gated_trees_draft_whichever_shape_costs_less_a_token(pair, monkeypatch, dear, broken):
    """A drafter whose tree emits 3 tokens a round and whose chain 1, made slow by 100 ms a round in one shape
    (the tree: 100 ms for 3 tokens, dearer than a round of one verify row for 1): the run drafts the other shape in most
    drafting rounds, and the output is the target's. Broken: a choice that always drafts the tree is caught where the
    tree is the dear shape."""
    import time

    if broken:
        monkeypatch.setattr(td.ShapeChoice, "tree", lambda self: True)
    target, _ = pair
    want = generate(target, PROMPT, 60).tokens
    drafter = Scripted(PROMPT + want, target.config.vocab_size)
    propose = drafter.propose_tree

    def slow(tokens, top_k, depth, budget, extend=None):
        if (top_k > 1) == (dear == "tree"):
            time.sleep(0.1)
        return propose(tokens, top_k, depth, budget, extend)

    drafter.propose_tree = slow
    res = td.tree_speculative_generate(target, drafter, PROMPT, 60, top_k=2, depth=3, budget=6,
                                       adaptive=Always(3, gated=True))
    assert res.tokens == want
    drafting = res.stats["rounds"] - res.stats["plain_rounds"]
    cheap = res.stats["chain_rounds"] if dear == "tree" else drafting - res.stats["chain_rounds"]
    assert (cheap >= 0.6 * drafting) != (broken and dear == "tree")


def test_a_gate_grows_the_tree_only_below_nodes_whose_chance_pays_a_step():
    """extend (the draft budget's gate: a level costs a draft step) is asked for every frontier node before its level is
    drafted: children only under nodes it accepts, and no level at all when it accepts none; without it, every
    level."""
    def topk(ctx, k):
        return np.array([1, 2][:k]), np.log(np.array([0.6, 0.4][:k]))

    asked = []

    def extend(level, p):
        asked.append((level, round(p, 6)))
        return p >= 0.35

    full = build_tree(topk, [7, 7], 2, 3, 14)
    grown = build_tree(topk, [7, 7], 2, 3, 14, extend)
    assert len(full) == 2 + 4 + 4
    assert len(grown) == 2 + 4 + 2  # level 2 only below the 0.36 node (0.6 x 0.6): the 0.24 ones are not worth a step
    assert asked == [(1, 0.6), (1, 0.4), (2, 0.36), (2, 0.24)]
    probs = np.exp(grown.scores)
    assert all(probs[grown.parents[i]] >= 0.35 for i in range(len(grown)) if grown.parents[i] >= 0)
    assert len(build_tree(topk, [7, 7], 2, 3, 14, lambda level, p: False)) == 2  # the first level only


def test_chain_shaped_rounds_verify_and_draft_as_causal_steps(pair, monkeypatch):
    """A round whose tree is a chain (top_k 1, or a plain step) is verified by a causal step, and the head drafts a
    one-row level by its causal step: the same rows (a chain's tree mask is causal; cpu/decoder.py takes the causal
    attention for it, TreeStep.causal), without the masked attention's cost; the output is still the target's."""
    from minitorch.cpu import decoder as cpu_decoder

    target, head = pair
    want = generate(target, PROMPT, 30).tokens
    masked = []
    real = cpu_decoder.ff

    class Spy:  # the fused kernels, the attention ones noting whether they were given a mask
        def __getattr__(self, name):
            fn = getattr(real, name)
            if not name.startswith("attention_"):
                return fn

            def attention(*a):
                masked.append(a[-2] is not real.NO_MASK)
                return fn(*a)
            return attention

    monkeypatch.setattr(cpu_decoder, "ff", Spy())
    res = td.tree_speculative_generate(target, HeadDrafter(head, target), PROMPT, 30, top_k=1, depth=3, budget=3)
    assert res.tokens == want
    assert masked and not any(masked)  # the target's verifies and the head's levels alike
    masked.clear()
    res = td.tree_speculative_generate(target, HeadDrafter(head, target), PROMPT, 30, top_k=2, depth=3, budget=6)
    assert res.tokens == want and any(masked) and not all(masked)


def test_the_chain_rounds_of_gated_trees_are_the_chain_loops(pair, monkeypatch):
    """With the draft budget, a round that takes the chain is speculative.py's (chain_round: the head's propose, a
    causal verify): forced to the chain every round, the tree loop asks the head for chains only, never for a tree,
    and drafts, accepts and emits what speculative_generate does with the same budget."""
    from minitorch.generation.speculative import speculative_generate

    target, head = pair
    monkeypatch.setattr(td.ShapeChoice, "tree", lambda self: False)
    d, calls = HeadDrafter(head, target), []
    for name in ("propose", "propose_tree"):
        real = getattr(d, name)
        setattr(d, name, lambda *a, _real=real, _name=name, **kw: calls.append(_name) or _real(*a, **kw))
    res = td.tree_speculative_generate(target, d, PROMPT, 40, top_k=2, depth=3, budget=6,
                                       adaptive=Always(3, gated=True))
    ref = speculative_generate(target, HeadDrafter(head, target), PROMPT, 40, gamma=3,
                               adaptive_gamma=Always(3, gated=True))
    assert res.tokens == ref.tokens == generate(target, PROMPT, 40).tokens
    assert calls and set(calls) == {"propose"}
    for key in ("rounds", "drafted", "accepted", "per_position_acceptance"):
        assert res.stats[key] == ref.stats[key], key
    assert res.stats["chain_rounds"] == res.stats["rounds"]
