"""Greedy speculative decoding with draft trees on the CUDA-graph path (issue 44): the GPU's tree_decoding.py.

A round, all on the target's stream, the host reading back only the round's result:

    draft:   the draft head's chain of g tokens (HeadGpuDrafter.draft(top_k=...): its one-row graphs), and after each
             step the top_k tokens of its distribution there (kernels/tree.cu topk_part_f32 + topk_merge_f32)
    verify:  one graph = the chain into the target's rows 1..g (gather_drafts), the alternatives into the rows after
             (tree_alternatives: a row under the chain's row d - 1 takes the next of step d's list that is not the
             chain's token), the tree step (CudaDecoder.tree_step: every row at its depth, seeing the cache
             and its own path), the greedy walk (tree_accept), the accepted path's K/V and hidden states moved into
             place (tree_keep) and the position advanced (tree_advance)
    read:    [n, accepted tokens, next]: the chain engine's spec_out, so the head's next round reads the verified
             rows exactly as after a chain (its first step takes the target's rows 0..n)

The tree is the chain with alternatives at its shallow depths ("a chain with leaves"): `budget` nodes in all, the g
chain tokens and up to top_k - 1 alternatives a depth, depth 1 first. An alternative is a leaf: when the chain's token
at depth d is rejected and the target's own token is one of the head's next choices there, the round keeps it and the
target's token after it (the leaf's row gives that), one token more than the chain. A tree of T = 1 + budget rows is
one verify step of T rows: the tensor-core GEMV takes up to 16 tokens a pass, so T <= 16 (TREE_MAX_ROWS). On one H100
a 16-row tree round verifies in 1.16 decode steps (GSM8K; 1.27 on MATH-500's longer contexts) against a chain's 1.02.
Its drafting adds the top-k lists between the head's one-row graphs: one block a list (topk_f32) cost a 3,5,15 tree
0.41 steps a round against a gamma-6 chain's 0.25 (docs/results/h100_split_norm/: 2.28x against 2.37x); two passes
(topk_part_f32 over chunks of TOPK_CHUNK logits, topk_merge_f32) with the head's 8-bit rows, 0.27 against 0.22
(docs/results/gpu_int8_head/): GSM8K first 20 2.50-2.54x against the chain's 2.45x, MATH-500 2.35x against 2.49x.
The head drafts no branch of its own (no tree attention in the head): the alternatives come free from the
distributions it computes for the chain.

Exact by construction: each row is built to get a decode step's logits at its position after its own path
(CudaDecoder.tree_step), and the walk emits the target's argmax at every step, so the output is the target alone's.
tests/test_cuda_tree.py checks both (15 of 15 on an H100; the host logic also runs on CPU fakes:
tests/test_generation_cuda_tree_host.py). Greedy only: sampling keeps chains (speculative_generate_cuda).
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .autoregressive import TokenCallback, emit
from .cuda import HeadGpuDrafter, _check, _gather, _verify, as_gpu_drafter, start_round_loop
from .sampling import SamplingConfig
from .stats import GenerationResult, SpecStats
from .tree import check_tree_request

TOPK_MAX = 8  # kernels/tree.cu's largest list


def chain_with_leaves(g: int, top_k: int, budget: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(parents of the step's rows, alternatives a depth) of a round's tree: row 0 the root (the pending token),
    rows 1..g the chain (row d under row d - 1), then min(budget - g, g * (top_k - 1)) alternatives, depth 1 first,
    up to top_k - 1 a depth, each a leaf under the chain's row at the depth above."""
    if g < 0 or top_k < 1 or budget < g:
        raise ValueError(f"a tree of chain {g}, top_k {top_k}, budget {budget}: budget must cover the chain")
    left = min(budget - g, g * (top_k - 1))
    nalt = []
    for _ in range(g):
        take = min(top_k - 1, left)
        nalt.append(take)
        left -= take
    parents = [-1] + list(range(g))
    for d, n in enumerate(nalt, start=1):
        parents += [d - 1] * n
    return tuple(parents), tuple(nalt)


def _tree_verify(target: Any, head: Any, g: int, parents: tuple[int, ...], lists: Any) -> None:
    """Replay (capturing on first use) the verify graph of a tree shape: rows, tree step, walk, keep, advance."""
    tables = target.tree_tables(parents)
    i32 = np.int32
    key = ("tree", parents, id(head), id(lists))

    def enqueue() -> None:
        _gather(target, head, g)
        if tables.T > g + 1:
            target.k.launch("tree_alternatives", (1,), (32,), (target.tokens, lists, i32(lists.shape[1]), i32(g),
                                                               tables.parents, i32(tables.T)))
        target.tree_step(tables)
        target.k.launch("tree_accept", (1,), (1,), (target.next_ids, target.tokens, tables.parents,
                                                   i32(tables.T), tables.path, target.spec_out))
        target.tree_keep(tables)

    target.graph_refs[key] = (head, lists)  # buffers the graph reads: alive as long as it
    target.graph(key, enqueue, lambda: target.tree_step(tables),
                 kernel_names=("gather_drafts", "tree_alternatives", "tree_accept", "tree_keep", "tree_advance"))


def tree_speculative_generate_cuda(target: Any, drafter: Any, prompt_ids: Sequence[int], max_new_tokens: int,
                                   top_k: int = 3, depth: int = 4, budget: int = 12,
                                   cfg: SamplingConfig | None = None, stop_ids: Iterable[int] | None = None,
                                   vocab_size: int | None = None,
                                   on_tokens: TokenCallback | None = None) -> GenerationResult:
    """Greedy generation with a chain of `depth` head drafts and up to top_k - 1 alternatives a depth, `budget`
    nodes in all (module docstring), on a CudaDecoder target (the tensor-core GEMV) and a draft head's
    HeadGpuDrafter (or its HeadDecoder). The stats are speculative_generate_cuda's with a tree's nodes as a round's
    drafts, plus tree (top_k, depth, budget) and per_round_nodes."""
    cfg = cfg or SamplingConfig()
    check_tree_request(cfg.greedy, top_k, depth, budget, "speculative_generate_cuda")
    if top_k > TOPK_MAX:
        raise ValueError(f"top_k must be at most {TOPK_MAX} on the GPU (kernels/tree.cu's lists), got {top_k}")
    if budget < depth:
        raise ValueError(f"budget ({budget} nodes) must cover the chain's depth ({depth})")
    drafter = as_gpu_drafter(drafter)
    if not isinstance(drafter, HeadGpuDrafter) or drafter.lookup_steps:
        raise ValueError("a GPU draft tree is drafted by a draft head (HeadGpuDrafter, without prompt lookup)")
    head = drafter.device
    nodes_max = min(budget, depth * top_k)
    why = target.tree_unsupported(1 + nodes_max)
    if why:
        raise ValueError(why)
    prompt = [int(t) for t in prompt_ids]
    _check(target, prompt, max_new_tokens, nodes_max + 1)
    drafter.check(target, prompt, max_new_tokens, depth)
    stops = set(int(s) for s in (stop_ids or ()))
    vocab = min(target.V, head.V, int(vocab_size or target.V))
    cp, stream = target.cp, target.stream
    lists = drafter.top_k_lists(depth, top_k)  # the head's top-k lists of a round, one row a chain step
    st = SpecStats()
    t0 = time.perf_counter()
    start_round_loop(target, drafter, prompt, max_new_tokens, vocab, cfg, st)
    events = [cp.cuda.Event() for _ in range(3)]
    out: list[int] = []
    nodes: list[int] = []
    first_T, done = 1, False
    while not done:
        g = min(depth, max_new_tokens - len(out) - 1)  # a round emits at most g + 1 tokens
        events[0].record(stream)
        g, _ = drafter.draft(target, g, first_T, cfg, top_k=top_k)
        st.draft_forwards += g
        events[1].record(stream)
        if g > 0:
            parents, _ = chain_with_leaves(g, top_k, budget)
            _tree_verify(target, head, g, parents, lists)
        else:  # nothing drafted (a one-token prompt's first round, a run's last token): a plain verify
            parents = (-1,)
            _verify(target, head, 0, 0, lookup=False)
        events[2].record(stream)
        res = target.spec_out[:len(parents) + 1].get(stream=stream)  # waits for the round
        st.timer.add("draft", cp.cuda.get_elapsed_time(events[0], events[1]) / 1e3)
        st.timer.add("verify", cp.cuda.get_elapsed_time(events[1], events[2]) / 1e3)
        n = int(res[0])
        n_emit, done = emit([int(t) for t in res[1:n + 2]], out, max_new_tokens, stops)
        from_drafts = min(n_emit, n)
        st.record_round(len(parents) - 1, n, from_drafts, n_emit - from_drafts)
        nodes.append(len(parents) - 1)
        drafter.emitted(out[len(out) - n_emit:])
        if on_tokens is not None:
            on_tokens(out[len(out) - n_emit:])
        first_T = drafter.next_first_T(n, g)
    stats = st.as_dict(time.perf_counter() - t0)
    stats.update(tree=[top_k, depth, budget], per_round_nodes=nodes)
    return GenerationResult(tokens=out, stop_reason="stop" if out and out[-1] in stops else "length", stats=stats)


def capture_tree_graphs(target: Any, drafter: Any, prompt_ids: Sequence[int], top_k: int, depth: int, budget: int,
                        vocab_size: int | None = None) -> None:
    """Capture every graph a tree run of these settings can replay (a run's last rounds draft shorter chains: a short
    run of each length 1..depth + 1), and the head's first steps after every accepted count (its capture), so none
    is captured inside a timed run. Leaves both caches to be refilled (the next run prefills anew)."""
    drafter = as_gpu_drafter(drafter)
    for m in range(1, depth + 2):
        tree_speculative_generate_cuda(target, drafter, prompt_ids, m, top_k, depth, budget, vocab_size=vocab_size)
    drafter.capture(target, depth)
    target.stream.synchronize()
