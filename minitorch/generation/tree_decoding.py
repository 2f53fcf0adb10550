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
score is below its parent's, so the kept nodes hang together), and a round drafts at all only while drafting rounds
have saved time, else plain steps and probes. With top_k 1 the gated tree is the gated chain's rule over a fixed
depth of head steps.
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .. import no_grad
from ..models.tree_step import keep_path
from .autoregressive import TokenCallback, check_request, emit
from .budget import CostBudget
from .speculative import prefill_first_token
from .sampling import SamplingConfig, greedy_tokens, logits_rows
from .stats import GenerationResult, SpecStats
from .tree import DraftTree, accept_tree_greedy, check_tree_request


def step_parents(tree: DraftTree) -> list[int]:
    """A verify step's rows: the pending token under the cache, then node i as row i + 1 under its parent's row."""
    return [-1] + [p + 1 for p in tree.parents]


@no_grad()  # inference: no autodiff history
def tree_speculative_generate(target: Any, drafter: Any, prompt_ids: Sequence[int], max_new_tokens: int,
                              top_k: int = 4, depth: int = 4, budget: int = 8, cfg: SamplingConfig | None = None,
                              stop_ids: Iterable[int] | None = None, vocab_size: int | None = None,
                              on_tokens: TokenCallback | None = None,
                              adaptive: bool | str | CostBudget = False) -> GenerationResult:
    """Greedy generation with a draft tree a round (top_k children a node, depth levels, the budget best nodes kept);
    drafter: a HeadDrafter (propose_tree, observe). adaptive "cost" (or a gated CostBudget): the gate prunes each
    tree and decides whether a round drafts (module docstring). The stats are speculative_generate's, with a tree's
    nodes as its drafts (alpha: accepted nodes over nodes) and per_round_nodes / tree (top_k, depth, budget) and, with
    the budget, plain_rounds added."""
    cfg = cfg or SamplingConfig()
    check_tree_request(cfg.greedy, top_k, depth, budget, "speculative_generate")
    if not hasattr(drafter, "propose_tree"):
        raise ValueError("a draft tree needs a drafter with propose_tree (a draft head)")
    prompt = [int(t) for t in prompt_ids]
    check_request(target, prompt, max_new_tokens)
    vocab = int(vocab_size or target.config.vocab_size)
    stops = set(int(s) for s in (stop_ids or ()))
    st = SpecStats()
    timer = st.timer
    t0 = time.perf_counter()
    max_len = len(prompt) + max_new_tokens
    cache = target.new_cache(max_len + budget + 1)  # a round writes budget + 1 rows before it keeps its path
    # a tree's levels sit in the drafter's cache for a round
    out, done = prefill_first_token(target, drafter, prompt, cache, max_len + top_k * depth + 1, vocab, cfg,
                                    cfg.make_rng(), stops, max_new_tokens, st, on_tokens)
    gate = adaptive if isinstance(adaptive, CostBudget) else (
        CostBudget(depth, gated=True) if adaptive == "cost" else None)
    context, nodes = prompt + out, []
    while not done:
        before = st.costs()
        tree = DraftTree()
        if gate is None or gate.choose(st.position_accepted, st.position_judged):
            with timer("draft"):
                f0 = drafter.forwards
                tree = full = drafter.propose_tree(context, top_k, depth, budget)
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
            nodes.append(len(tree))
            context.extend(out[len(out) - n_emit:])
            rows = [0, *(i + 1 for i in accepted)][:n_emit]  # the pending token and the emitted nodes' rows
            keep_path(cache, start, rows)
            drafter.observe(np.ascontiguousarray(feats.to_numpy()[0][rows]))
            drafter.rollback(len(context) - 1)
        if gate is not None:
            gate.record(len(tree), *st.costs_since(before), n_emit)
        if on_tokens is not None:
            on_tokens(out[len(out) - n_emit:])
    stats = st.as_dict(time.perf_counter() - t0)
    stats.update(tree=[top_k, depth, budget], per_round_nodes=nodes)
    if gate is not None:
        stats["plain_rounds"] = gate.choices.count(0)
    stop_reason = "stop" if out and out[-1] in stops else "length"
    return GenerationResult(tokens=out, stop_reason=stop_reason, stats=stats)
