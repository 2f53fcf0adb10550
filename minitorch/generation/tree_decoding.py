"""Greedy speculative decoding with draft trees on the CPU engine (issue 44): a drafter proposes a tree below the
pending token (HeadDrafter.propose_tree: EAGLE-2's dynamic selection), the target scores the pending token and every
node in ONE forward whose rows see only their own ancestors (models/tree_step.py), the walk keeps the longest path
whose every token is the target's argmax after the ones before it (tree.py's accept_tree_greedy), and both caches
keep exactly that path (keep_path moves its K/V rows into place; the head gets the path's features).

Each row's logits are those of a causal step over its own path (bit for bit on the CPU's one-call forward), and the
walk emits the target's argmax at every step, so the output is the target alone's, as with chains. Greedy only:
sampling keeps chains (speculative.py), since lossless multi-candidate acceptance is not built here.

A round's cost is the drafter's depth steps plus a verify of nodes + 1 rows; on a 2-core CPU a row costs about a
quarter of a step, so a tree pays only where its extra branches are accepted often. With the draft budget
(adaptive "cost", the CPU default) the tree is gated as a chain is (budget.py): a node is kept only if its path's
probability under the head, exp(its score), pays the verify row it adds (the chain's rule, node by node: a node's
score is below its parent's, so the kept nodes hang together); a level is drafted only below the nodes whose
probability pays a draft step and its row (the chain's rule for drafting one more), and none once no node's does; and
a round drafts at all only while drafting rounds have saved time, else plain steps and probes. With top_k 1 the gated
tree is the gated chain.

A tree is not always worth its price: on a 2-core Zen 3 its top_k-row head steps and wider verifies saved less than
the chain's (GSM8K first 20: a 2,3,6 tree 1.06x, the gated chain 1.29x). So with the draft budget each round is in
the charge of one shape, the tree or the chain of the same depth (top_k 1), whichever has cost fewer seconds a token
emitted in its rounds so far (ShapeChoice: each shape a few rounds first, then the cheaper one, the other now and then
to see whether the text has changed its mind; the chain unless the tree is cheaper beyond the noise of a round's 1 to
depth + 1 tokens). Each shape has its own gate, which prices only its rounds and may make
them plain steps; a shape's seconds a token count those plain steps too (one gate over both let the trees' dearer
rounds send the chain's plain). Like the budget it looks only at finished rounds: the output stays the target's. The
chain's rounds and the plain steps are speculative.py's own (chain_round: the head's causal draft steps, a causal
verify, the caches cut back), so the rounds that take the chain cost what the chain loop's do (before, as
chain-shaped trees, their head steps and cache moves had cost more: docs/results/cpu_zen3_tree_choice/).
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .. import no_grad
from ..models.tree_step import keep_path
from .autoregressive import TokenCallback, check_request, emit
from .budget import CostBudget
from .speculative import Round, chain_round, prefill_first_token
from .sampling import SamplingConfig, greedy_tokens, logits_rows
from .stats import GenerationResult, SpecStats
from .tree import DraftTree, accept_tree_greedy, check_tree_request


WARM_ROUNDS = 3  # drafting rounds of each shape before ShapeChoice compares them
RECHECK = 12  # rounds of the cheaper shape between two of the other
SHAPE_EMA = 0.2  # weight of a new round in a shape's running seconds and tokens (a plain mean for the first 1 / it)
SHAPE_Z = 1.5  # the tree is taken only where its seconds a token beat the chain's by this many standard errors


class ShapeChoice:
    """Whether a drafting round drafts the tree (True) or the chain (False): each shape WARM_ROUNDS rounds in turn,
    then the one with fewer seconds a token in its running means, the other once after every RECHECK rounds. The first
    round recorded is the run's warm-up (cold, right after the prefill) and is not counted.

    The chain is the default: the tree must be cheaper by SHAPE_Z standard errors of the difference. A round emits 1
    to depth + 1 tokens, so ~9 rounds' means of two shapes whose costs differ by a few percent (a CPU's: GSM8K's tree
    rounds were 6.5% dearer a token, tools/cpu_round_costs.py) took the dearer one in over a third of the rounds."""

    def __init__(self, warm: int = WARM_ROUNDS, recheck: int = RECHECK) -> None:
        self.warm, self.recheck = warm, recheck
        self.seconds = {True: 0.0, False: 0.0}  # running mean seconds of a round, by shape
        self.tokens = {True: 0.0, False: 0.0}  # running mean tokens a round emitted
        self.squares = {True: 0.0, False: 0.0}  # running mean of their squares (the spread)
        self.counted = {True: 0, False: 0}
        self.streak = 0  # rounds of the cheaper shape since the other one ran
        self._warmed = False

    def per_token(self, tree: bool) -> float:
        return self.seconds[tree] / max(self.tokens[tree], 1e-9)

    def error(self, tree: bool) -> float:
        """Standard error of per_token(tree) from the spread of tokens a round, over the rounds its mean weighs."""
        n = max(min(self.counted[tree], (2.0 - SHAPE_EMA) / SHAPE_EMA), 1.0)
        spread = max(self.squares[tree] - self.tokens[tree] ** 2, 0.0)
        return self.per_token(tree) * math.sqrt(spread / n) / max(self.tokens[tree], 1e-9)

    def tree_cheaper(self) -> bool:
        return self.per_token(True) + SHAPE_Z * math.hypot(self.error(True), self.error(False)) < self.per_token(False)

    def tree(self) -> bool:
        if min(self.counted.values()) < self.warm:
            return self.counted[True] <= self.counted[False]  # in turn, the tree first
        best = self.tree_cheaper()
        if self.streak >= self.recheck:
            return not best
        return best

    def record(self, tree: bool, seconds: float, emitted: int) -> None:
        """A finished drafting round of this shape: its seconds (draft and verify) and the tokens it emitted."""
        if not self._warmed:
            self._warmed = True
            return
        warm = min(self.counted.values()) < self.warm
        best = self.tree_cheaper()
        self.counted[tree] += 1
        w = max(SHAPE_EMA, 1.0 / self.counted[tree])
        self.seconds[tree] += w * (seconds - self.seconds[tree])
        self.tokens[tree] += w * (emitted - self.tokens[tree])
        self.squares[tree] += w * (emitted * emitted - self.squares[tree])
        self.streak = 0 if warm or tree != best else self.streak + 1


def step_parents(tree: DraftTree) -> list[int]:
    """A verify step's rows: the pending token under the cache, then node i as row i + 1 under its parent's row."""
    return [-1] + [p + 1 for p in tree.parents]


def tree_round(target: Any, drafter: Any, cache: Any, context: list[int], out: list[int], top_k: int, depth: int,
               budget: int, st: SpecStats, vocab: int, stops: set[int], max_new_tokens: int,
               gate: CostBudget | None) -> Round:
    """One round of a tree: drafted (pruned by the gate's include, grown by its extend), verified in one target step,
    the longest accepted path emitted and kept in both caches. (Plain steps are chain_round's.)"""
    timer = st.timer
    with timer("draft"):
        f0 = drafter.forwards
        tree = full = drafter.propose_tree(context, top_k, depth, budget,
                                           extend=gate.extend if gate is not None else None)
        if gate is not None:  # keep the nodes whose chance pays their row
            tree = full.pruned(lambda i: gate.include(full.depth(i), float(np.exp(full.scores[i]))))
        st.draft_forwards += drafter.forwards - f0
    start = cache.length
    with timer("verify"):
        logits, feats = target([context[-1], *tree.tokens], cache, parents=step_parents(tree), return_hidden=True)
        best = greedy_tokens(logits_rows(logits, vocab))
    with timer("sample"):
        accepted, nxt = accept_tree_greedy(tree, int(best[0]), [int(b) for b in best[1:]])
        n_emit, done = emit([*(tree.tokens[i] for i in accepted), nxt], out, max_new_tokens, stops)
        from_drafts = min(n_emit, len(accepted))
        st.record_round(len(tree), len(accepted), from_drafts, n_emit - from_drafts)
        context.extend(out[len(out) - n_emit:])
        rows = [0, *(i + 1 for i in accepted)][:n_emit]  # the pending token and the emitted nodes' rows
        keep_path(cache, start, rows)
        drafter.observe(np.ascontiguousarray(feats.to_numpy()[0][rows]))
        drafter.rollback(len(context) - 1)
    return Round(n_emit, done, len(tree), len(accepted))


@no_grad()  # inference: no autodiff history
def tree_speculative_generate(target: Any, drafter: Any, prompt_ids: Sequence[int], max_new_tokens: int,
                              top_k: int = 4, depth: int = 4, budget: int = 8, cfg: SamplingConfig | None = None,
                              stop_ids: Iterable[int] | None = None, vocab_size: int | None = None,
                              on_tokens: TokenCallback | None = None,
                              adaptive: bool | str | CostBudget = False) -> GenerationResult:
    """Greedy generation with a draft tree a round (top_k children a node, depth levels, the budget best nodes kept);
    drafter: a HeadDrafter (propose_tree, observe; with the budget also propose, for the chain's rounds). adaptive
    "cost" (or a gated CostBudget, the tree's gate; the chain's is a new one of its class): the gates prune each tree
    and decide whether a round drafts (module docstring); the chain rounds and plain steps are speculative.py's
    (chain_round). The stats are speculative_generate's, with a tree's nodes as its drafts (alpha: accepted nodes over
    nodes) and per_round_nodes / tree (top_k, depth, budget) and, with the budget, plain_rounds and chain_rounds
    (drafting rounds that drafted the chain: ShapeChoice) added."""
    cfg = cfg or SamplingConfig()
    check_tree_request(cfg.greedy, top_k, depth, budget, "speculative_generate")
    if not hasattr(drafter, "propose_tree") or (adaptive and not hasattr(drafter, "propose")):
        raise ValueError("a draft tree needs a drafter with propose_tree (a draft head), and with the draft budget "
                         "propose too (its chain rounds)")
    prompt = [int(t) for t in prompt_ids]
    check_request(target, prompt, max_new_tokens)
    vocab = int(vocab_size or target.config.vocab_size)
    stops = set(int(s) for s in (stop_ids or ()))
    st = SpecStats()
    t0 = time.perf_counter()
    max_len = len(prompt) + max_new_tokens
    cache = target.new_cache(max_len + budget + 1)  # a round writes budget + 1 rows before it keeps its path
    # a tree's levels sit in the drafter's cache for a round
    out, done = prefill_first_token(target, drafter, prompt, cache, max_len + top_k * depth + 1, vocab, cfg,
                                    cfg.make_rng(), stops, max_new_tokens, st, on_tokens)
    gate = adaptive if isinstance(adaptive, CostBudget) else (
        CostBudget(depth, gated=True) if adaptive == "cost" else None)
    shape = ShapeChoice() if gate is not None and top_k > 1 else None
    # a gate a shape: each prices only its own rounds (one over both went plain where the chain would have drafted)
    chain_gate = gate if shape is None else type(gate)(depth, gated=True)
    rng = cfg.make_rng()  # greedy: the chain rounds' drafter never draws from it
    context, nodes, chains = prompt + out, [], 0
    while not done:
        before = st.costs()
        k, as_tree = 0, shape is None or shape.tree()
        now = gate if shape is not None and as_tree else chain_gate  # the shape in charge's gate (None: no budget)
        if now is None or now.choose(st.position_accepted, st.position_judged):
            k = top_k if as_tree else 1
        if now is not None and k <= 1:  # the chain's round or a plain step, as speculative_generate runs them
            chains += k
            g = min(depth * k, max_new_tokens - len(out) - 1)  # never more than can be emitted, as speculative.py
            r = chain_round(target, drafter, cache, context, out, g, cfg, rng, st, vocab, stops, max_new_tokens, now,
                            wants_feats=True)
        else:
            r = tree_round(target, drafter, cache, context, out, k, depth, budget, st, vocab, stops, max_new_tokens,
                           now)
        done = r.done
        nodes.append(r.drafted)
        if now is not None:
            forwards, t_draft, t_verify = st.costs_since(before)
            now.record(r.drafted, forwards, t_draft, t_verify, r.emitted)
            if shape is not None:  # the round under the shape in charge, its gate's plain steps too
                shape.record(as_tree, t_draft + t_verify, r.emitted)
        if on_tokens is not None:
            on_tokens(out[len(out) - r.emitted:])
    stats = st.as_dict(time.perf_counter() - t0)
    stats.update(tree=[top_k, depth, budget], per_round_nodes=nodes)
    if gate is not None:
        stats["plain_rounds"] = gate.choices.count(0) + (chain_gate.choices.count(0) if chain_gate is not gate else 0)
        stats["chain_rounds"] = chains
    stop_reason = "stop" if out and out[-1] in stops else "length"
    return GenerationResult(tokens=out, stop_reason=stop_reason, stats=stats)
