"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023), gpt-fast style.

One round: the drafter proposes g tokens d_1..d_g; the target scores [pending, d_1..d_g] in ONE
forward, giving g+1 rows of logits (row i predicts the token after d_1..d_i); we accept a prefix of
the drafts and always add one token from the target (a correction or a bonus), so every round emits
between 1 and g+1 tokens. Acceptance rule, for the target distribution p and draft distribution q
at each position (both after temperature/top-k/top-p):

    accept d_i with probability min(1, p(d_i) / q(d_i))            (draw r ~ U[0,1), accept if r*q < p)
    at the first rejection, emit x ~ norm(max(p - q, 0)) and stop  (the residual distribution)
    if all g are accepted, emit a bonus token x ~ p_{g+1}

which makes every emitted token exactly p-distributed. Greedy (temperature 0) is the same rule with
p and q one-hot: accept while d_i == argmax p_i, then emit argmax p at the first mismatch. A
deterministic drafter (n-gram) has q = point mass: accept with probability p(d_i), residual = p
with d_i removed.

The prefill runs the whole prompt, as the target alone's does, and its last row gives the first token, so a
generation needs no round for it. Cache invariant between rounds (both caches): K/V for every context token except
the last one ("pending"), so the next verification feeds [pending, drafts]. After a round, the target cache is
truncated to len(context) - 1 and the drafter rolled back to the same prefix. Output is cut at the
first stop token and at max_new_tokens, even inside an accepted run, and the caches follow the cut.
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from .. import no_grad
from .autoregressive import TokenCallback, check_request, emit
from .budget import CostBudget
from .drafters import Drafter, ModelDrafter
from .sampling import SamplingConfig, greedy_tokens, logits_rows, logits_to_probs, next_token, sample
from .stats import GenerationResult, SpecStats

MAX_ADAPTIVE_GAMMA = 16


def residual_distribution(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """norm(max(p - q, 0)); falls back to p when the residual has no mass (p == q)."""
    r = np.maximum(p - q, 0.0)
    total = r.sum()
    return r / total if total > 0 else p


def accept_greedy(target_argmax: np.ndarray, drafts: Sequence[int]) -> tuple[int, int]:
    """Greedy rule: accept while the draft equals the target's argmax. Returns (n_accepted, next)."""
    n = 0
    while n < len(drafts) and drafts[n] == int(target_argmax[n]):
        n += 1
    return n, int(target_argmax[n])


def accept_sampled(rows: np.ndarray, drafts: Sequence[int], q: np.ndarray | None,
                   cfg: SamplingConfig, rng: np.random.Generator) -> tuple[int, int]:
    """Sampling rule on target logits rows (g+1, V) and draft probs q (g, V) or None (point mass).

    Target probabilities are computed only for the rows that are reached. Returns (n_accepted, next).
    """
    for i, d in enumerate(drafts):
        p = logits_to_probs(rows[i], cfg)
        q_d = 1.0 if q is None else q[i, d]
        if rng.random() * q_d < p[d]:  # accept with probability min(1, p/q)
            continue
        if q is None:
            q_i = np.zeros_like(p)
            q_i[d] = 1.0
        else:
            q_i = q[i]
        return i, sample(residual_distribution(p, q_i), rng)
    return len(drafts), sample(logits_to_probs(rows[len(drafts)], cfg), rng)


def verify(target: Any, cache: Any, pending: int, drafts: Sequence[int], vocab: int,
           hidden: bool = False) -> tuple[np.ndarray, Any]:
    """One target forward over [pending, drafts]: (g+1, V) logits rows (a view; read before the next call) and,
    when asked (a drafter that reads the target's features), the final hidden states (1, g+1, D), else None."""
    if hidden:
        logits, feats = target([pending, *drafts], cache, return_hidden=True)
        return logits_rows(logits, vocab), feats
    return logits_rows(target([pending, *drafts], cache), vocab), None


def next_gamma(gamma: int, n_drafted: int, n_accepted: int) -> int:
    """Adaptive draft length: +1 after a fully accepted draft, -1 after a rejection in its first half."""
    if n_drafted == 0:
        return gamma
    if n_accepted == n_drafted and n_drafted == gamma:
        return min(gamma + 1, MAX_ADAPTIVE_GAMMA)
    if n_accepted < n_drafted / 2:
        return max(gamma - 1, 1)
    return gamma


def prefill_first_token(target: Any, drafter: Any, prompt: list[int], cache: Any, drafter_len: int, vocab: int,
                        cfg: SamplingConfig, rng: np.random.Generator, stops: set[int], max_new_tokens: int,
                        st: SpecStats, on_tokens: TokenCallback | None) -> tuple[list[int], bool]:
    """The whole prompt through the target, as the target alone's prefill, and the drafter started (with the prompt's
    features, for a drafter that reads them); the prefill's last row gives the first token, counted in st as a
    target token of no round. Returns (out, done)."""
    with st.timer("prefill"):
        if getattr(drafter, "needs_hidden", False):
            logits, feats = target(prompt, cache, last_n=1, return_hidden=True)
            drafter.start(prompt, drafter_len, vocab)
            drafter.observe(feats)  # features of positions 0 .. len(prompt) - 1
        else:
            logits = target(prompt, cache, last_n=1)
            drafter.start(prompt, drafter_len, vocab)
    with st.timer("sample"):
        first = next_token(logits_rows(logits, vocab)[-1], cfg, rng)
    out: list[int] = []
    _, done = emit([first], out, max_new_tokens, stops)
    st.new_tokens += 1
    st.target_tokens += 1
    st.prefill_tokens = 1
    if on_tokens is not None:
        on_tokens(list(out))
    return out, done


class Round(NamedTuple):
    """What one round did: the tokens it emitted, whether the generation is done, the drafts it verified and how many
    of them the target accepted."""
    emitted: int
    done: bool
    drafted: int
    accepted: int


def chain_round(target: Any, drafter: Any, cache: Any, context: list[int], out: list[int], g: int,
                cfg: SamplingConfig, rng: np.random.Generator, st: SpecStats, vocab: int, stops: set[int],
                max_new_tokens: int, gate: CostBudget | None = None, wants_feats: bool = False) -> Round:
    """One round (module docstring): up to g drafts (none: a plain target step), one verify, the accepted prefix and
    the target's token emitted into out and context, both caches rolled back to the context. gate: a gated budget
    the drafter asks before each draft. The tree loop (tree_decoding.py) runs its chain rounds through this too."""
    drafts: list[int] = []
    q = None
    timer = st.timer
    if g > 0:
        with timer("draft"):
            f0 = drafter.forwards
            drafts, q = (drafter.propose(context, g, cfg, rng) if gate is None
                         else drafter.propose(context, g, cfg, rng, gate=gate))
            st.draft_forwards += drafter.forwards - f0
    with timer("verify"):
        rows, feats = verify(target, cache, context[-1], drafts, vocab, wants_feats)  # (g+1, V)
    with timer("sample"):
        if cfg.greedy:
            n_acc, nxt = accept_greedy(greedy_tokens(rows), drafts)
        else:
            n_acc, nxt = accept_sampled(rows, drafts, q, cfg, rng)
        n_emit, done = emit([*drafts[:n_acc], nxt], out, max_new_tokens, stops)
        from_drafts = min(n_emit, n_acc)
        st.record_round(len(drafts), n_acc, from_drafts, n_emit - from_drafts)
        context.extend(out[len(out) - n_emit:])
        if feats is not None:  # the verified positions [pending, accepted drafts] now in the context
            drafter.observe(feats.narrow(1, 0, n_emit))
        # roll both caches back to the emitted prefix (all context tokens but the pending one)
        cache.truncate(len(context) - 1)
        drafter.rollback(len(context) - 1)
    return Round(n_emit, done, len(drafts), n_acc)


@no_grad()  # inference: no autodiff history
def speculative_generate(target: Any, drafter: Drafter | Any, prompt_ids: Sequence[int],
                         max_new_tokens: int, cfg: SamplingConfig | None = None,
                         stop_ids: Iterable[int] | None = None, gamma: int = 4,
                         adaptive_gamma: bool | str | CostBudget = False, vocab_size: int | None = None,
                         on_tokens: TokenCallback | None = None, cache: Any = None) -> GenerationResult:
    """Generate with a drafter proposing and the target verifying; output follows the target exactly.

    adaptive_gamma: False drafts gamma tokens a round; True adapts it to the last round (next_gamma); "cost" lets
    each round choose 0..gamma from the measured acceptance and draft / verify seconds (budget.py: 0 is a plain
    target step, so speculation never costs much more than the target alone); a CostBudget instance: that one.
    drafter: a Drafter (ModelDrafter, NGramDrafter) or a bare draft model (wrapped in ModelDrafter).
    vocab_size: candidate tokens are the first vocab_size logits (default: the shared vocabulary
    min(V_target, V_draft)); pass the same value to `generate` for a like-for-like baseline.
    on_tokens: called with each batch of emitted tokens (streaming).
    cache: an empty target cache to use (default: a new one of len(prompt) + max_new_tokens).
    """
    cfg = cfg or SamplingConfig()
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma (draft length) must be an integer >= 1, got {gamma!r}")
    prompt = [int(t) for t in prompt_ids]
    check_request(target, prompt, max_new_tokens)
    if not hasattr(drafter, "propose"):
        drafter = ModelDrafter(drafter)
    vocab = int(vocab_size or target.config.vocab_size)
    if drafter.vocab_size is not None:
        vocab = min(vocab, int(drafter.vocab_size))
    stops = set(int(s) for s in (stop_ids or ()))
    rng = cfg.make_rng()
    st = SpecStats()
    t0 = time.perf_counter()
    max_len = len(prompt) + max_new_tokens
    if cache is None:
        cache = target.new_cache(max_len)
    wants_feats = bool(getattr(drafter, "needs_hidden", False))  # a trained head drafts from the target's features
    out, done = prefill_first_token(target, drafter, prompt, cache, max_len, vocab, cfg, rng, stops, max_new_tokens,
                                    st, on_tokens)
    context = prompt + out  # the first token is the pending one: every context token but it is in the cache
    g_now = gamma
    gated = bool(getattr(drafter, "gated", False))  # a drafter that asks the budget before each draft (a head)
    budget = adaptive_gamma if isinstance(adaptive_gamma, CostBudget) else (
        CostBudget(gamma, gated=gated) if adaptive_gamma == "cost" else None)
    gate = budget if budget is not None and budget.gated and gated else None
    closed = 0
    while not done:
        if budget is not None:
            g_now = budget.choose(st.position_accepted, st.position_judged)
            before = st.costs()
        # never draft more than can be emitted: a round emits at most g + 1 tokens
        g = min(g_now, max_new_tokens - len(out) - 1)
        r = chain_round(target, drafter, cache, context, out, g, cfg, rng, st, vocab, stops, max_new_tokens, gate,
                        wants_feats)
        done = r.done
        closed += g > 0 and not r.drafted
        if budget is not None:
            budget.record(r.drafted, *st.costs_since(before), r.emitted)
        if on_tokens is not None:
            on_tokens(out[len(out) - r.emitted:])
        if adaptive_gamma is True:
            g_now = next_gamma(g_now, r.drafted, r.accepted)
    stats = st.as_dict(time.perf_counter() - t0)
    stats["gamma"] = gamma
    stats["adaptive_gamma"] = "cost" if budget is not None else adaptive_gamma
    if getattr(drafter, "lookup", 0):
        stats["lookup_rounds"] = drafter.lookup_rounds  # rounds a head drafted by prompt lookup first
    if budget is not None:
        stats["plain_rounds"] = budget.choices.count(0)
        if budget.gated:
            stats["gate_closed_rounds"] = closed  # rounds the drafter ran whose gate kept no draft
    stop_reason = "stop" if out and out[-1] in stops else "length"
    return GenerationResult(tokens=out, stop_reason=stop_reason, stats=stats)
