"""Speculative decoding on tiny numpy models: greedy equality with the target, exact stop/limit
handling, cache rollback, statistics bookkeeping, argument errors."""
from __future__ import annotations

import numpy as np
import pytest

from minitorch.generation import (
    ExtendedDrafter, ModelDrafter, NGramDrafter, SamplingConfig, generate, speculative_generate)
from minitorch.generation.speculative import next_gamma
from minitorch.generation.stats import predicted_speedup
from test_generation_fakes import FakeCache, FakeModel, assert_cache_equal, fresh_cache

V = 50
TARGET = FakeModel(V, seed=1)
DRAFT_CLOSE = FakeModel(V, seed=2, like=TARGET, noise=0.15)  # high acceptance
DRAFT_FAR = FakeModel(V, seed=3)  # unrelated: low acceptance
PROMPTS = [[3], [1, 2, 3, 4, 5], [7, 7, 7, 8, 9, 7, 7, 7, 8], list(range(20, 45))]


def _drafter(kind: str):
    if kind == "close":
        return ModelDrafter(DRAFT_CLOSE)
    if kind == "far":
        return ModelDrafter(DRAFT_FAR)
    if kind == "close+lookup":  # two model tokens, then prompt lookup up to gamma
        return ExtendedDrafter(ModelDrafter(DRAFT_CLOSE), steps=2)
    return NGramDrafter(max_ngram=3)


@pytest.mark.parametrize("kind", ["close", "far", "ngram", "close+lookup"])
@pytest.mark.parametrize("gamma", [1, 2, 4, 7])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_speculative_equals_autoregressive(kind, gamma, prompt):
    ref = generate(TARGET, prompt, 40)
    res = speculative_generate(TARGET, _drafter(kind), prompt, 40, gamma=gamma)
    assert res.tokens == ref.tokens
    assert res.stop_reason == ref.stop_reason == "length"


@pytest.mark.parametrize("adaptive", [False, True])
def test_greedy_equality_with_stop_tokens_and_adaptive_gamma(adaptive):
    ref_free = generate(TARGET, [1, 2, 3], 60)
    stop = ref_free.tokens[25]  # a token the target does emit
    ref = generate(TARGET, [1, 2, 3], 60, stop_ids={stop})
    assert ref.stop_reason == "stop" and ref.tokens[-1] == stop
    assert stop not in ref.tokens[:-1]
    for gamma in (1, 3, 6):
        res = speculative_generate(TARGET, ModelDrafter(DRAFT_CLOSE), [1, 2, 3], 60,
                                   stop_ids={stop}, gamma=gamma, adaptive_gamma=adaptive)
        assert res.tokens == ref.tokens
        assert res.stop_reason == "stop"


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 9, 16])
def test_max_new_tokens_exact_inside_accepted_runs(limit):
    # the draft IS the target: every draft is accepted, so the limit falls inside accepted runs
    ref = generate(TARGET, [4, 5], limit)
    for gamma in (1, 4, 8):
        res = speculative_generate(TARGET, ModelDrafter(TARGET), [4, 5], limit, gamma=gamma)
        assert len(res.tokens) == limit
        assert res.tokens == ref.tokens
        assert res.stop_reason == "length"


def _check_stop_inside_an_accepted_run() -> None:
    ref_free = generate(TARGET, [9], 30)
    stop = ref_free.tokens[5]
    first = ref_free.tokens.index(stop)
    cache = TARGET.new_cache(31)
    res = speculative_generate(TARGET, ModelDrafter(TARGET), [9], 30, stop_ids={stop}, gamma=8, cache=cache)
    assert res.tokens == ref_free.tokens[: first + 1]
    assert res.stop_reason == "stop"
    # the rule accepted every draft; alpha counts only emitted drafts, so the cut lowers it
    assert res.stats["token_acceptance"] == 1.0
    assert res.stats["accepted"] + res.stats["target_tokens"] == len(res.tokens)
    assert_cache_equal(cache, fresh_cache(TARGET, ([9] + res.tokens)[:-1]))  # the cache follows the cut


def test_stop_token_inside_an_accepted_run_cuts_there():
    _check_stop_inside_an_accepted_run()


def test_stop_check_catches_a_stop_seen_only_at_the_end_of_a_round(monkeypatch):
    """An emit that appends a round's tokens and looks for a stop token only in its last one fails the check."""
    import minitorch.generation.speculative as sp

    def round_end_emit(candidates, out, max_new_tokens, stop_ids):
        take = [int(t) for t in candidates][:max(0, max_new_tokens - len(out))]
        out.extend(take)
        return len(take), len(out) >= max_new_tokens or bool(take and take[-1] in stop_ids)

    monkeypatch.setattr(sp, "emit", round_end_emit)
    with pytest.raises(AssertionError):
        _check_stop_inside_an_accepted_run()


def test_vocab_compared_over_shared_part():
    # draft with 4 extra (padding) rows; the engine compares over the first 50
    big_draft = FakeModel(V + 4, seed=4, like=TARGET, noise=0.1)
    ref = generate(TARGET, [1, 2], 30, vocab_size=V)
    res = speculative_generate(TARGET, ModelDrafter(big_draft), [1, 2], 30, gamma=3)
    assert res.tokens == ref.tokens
    # target with padded rows, draft smaller: baseline over the same shared vocabulary
    padded_target = FakeModel(V + 6, seed=5, like=TARGET)
    ref2 = generate(padded_target, [1, 2], 30, vocab_size=V)
    res2 = speculative_generate(padded_target, ModelDrafter(DRAFT_CLOSE), [1, 2], 30, gamma=3)
    assert res2.tokens == ref2.tokens
    assert max(res2.tokens) < V


def test_tensor_like_logits_are_accepted():
    target = FakeModel(V, seed=1, tensor_out=True)
    draft = FakeModel(V, seed=2, like=target, noise=0.15, tensor_out=True)
    ref = generate(TARGET, [1, 2, 3], 20)
    assert speculative_generate(target, draft, [1, 2, 3], 20, gamma=3).tokens == ref.tokens


@pytest.mark.parametrize("cfg", [SamplingConfig(), SamplingConfig(temperature=0.9, top_k=10, seed=3)])
@pytest.mark.parametrize("kind", ["close", "far", "ngram"])
def test_rollback_leaves_caches_equal_to_a_fresh_run(cfg, kind):
    _check_rollback(cfg, kind)


class _KeepsPendingCache(FakeCache):
    """A target cache whose rollback keeps one position too many (as an engine calling truncate(len(context)))."""

    def truncate(self, n):
        super().truncate(min(n + 1, self.length))


@pytest.mark.parametrize("bug", ["draft-cache-one-too-many", "target-keeps-pending"])
def test_rollback_checks_catch_off_by_one_rollbacks(bug, monkeypatch):
    """The greedy equality and cache checks fail on a drafter whose rollback keeps one cache position too
    many (its token list right: output unchanged, only the cache check sees it) and on a target rollback that
    keeps the pending token (the next verify feeds it twice: the output changes)."""
    if bug == "draft-cache-one-too-many":
        def rollback(self, n):
            if n < len(self._ids):
                self.cache.truncate(min(n + 1, self.cache.length))
                del self._ids[n:]
        monkeypatch.setattr(ModelDrafter, "rollback", rollback)
        with pytest.raises(AssertionError):
            _check_rollback(SamplingConfig(), "close")
        assert speculative_generate(TARGET, _drafter("close"), [5, 6, 7, 5, 6], 33, gamma=5).tokens == \
            generate(TARGET, [5, 6, 7, 5, 6], 33).tokens  # the output alone does not show it
    else:
        cache = _KeepsPendingCache(200, TARGET.hidden)
        res = speculative_generate(TARGET, _drafter("close"), [5, 6, 7, 5, 6], 33, gamma=5, cache=cache)
        assert res.tokens != generate(TARGET, [5, 6, 7, 5, 6], 33).tokens


def _check_rollback(cfg, kind):
    prompt = [5, 6, 7, 5, 6]
    drafter = _drafter(kind)
    cache = TARGET.new_cache(len(prompt) + 33)
    res = speculative_generate(TARGET, drafter, prompt, 33, cfg, gamma=5, cache=cache)
    final = prompt + res.tokens
    # the target cache holds every token but the last (its logits were never needed)
    assert_cache_equal(cache, fresh_cache(TARGET, final[:-1]))
    if isinstance(drafter, ModelDrafter):
        n = drafter.cache.length
        assert len(final) - 2 <= n <= len(final) - 1  # after a fully accepted run, d_gamma is unfed
        assert_cache_equal(drafter.cache, fresh_cache(drafter.model, final[:n]))


def test_ar_cache_holds_all_but_last_token():
    cache = TARGET.new_cache(3 + 12)
    res = generate(TARGET, [1, 2, 3], 12, cache=cache)
    assert_cache_equal(cache, fresh_cache(TARGET, ([1, 2, 3] + res.tokens)[:-1]))


@pytest.mark.parametrize("cfg", [SamplingConfig(), SamplingConfig(temperature=1.0, seed=11)])
@pytest.mark.parametrize("kind", ["close", "far", "ngram"])
def test_stats_add_up(cfg, kind):
    stop = 17
    res = speculative_generate(TARGET, _drafter(kind), [1, 2, 3, 1, 2], 50, cfg, stop_ids={stop},
                               gamma=4)
    s = res.stats
    assert s["new_tokens"] == len(res.tokens)
    assert s["accepted"] <= s["drafted"]
    assert s["accepted"] + s["target_tokens"] == len(res.tokens)
    assert 0.0 <= s["alpha"] <= 1.0 and 0.0 <= s["token_acceptance"] <= 1.0
    assert s["target_forwards"] == s["rounds"] == sum(s["accept_length_hist"])
    # the prefill's (the first token), then one target token per verification, except when a stop token cuts the
    # last accepted run
    assert s["prefill_tokens"] == 1
    assert s["rounds"] - 1 <= s["target_tokens"] - 1 <= s["rounds"]
    assert s["tau"] == pytest.approx((len(res.tokens) - 1) / s["target_forwards"])
    assert 1.0 <= s["tau"] <= 5.0
    assert sum(n * c for n, c in enumerate(s["accept_length_hist"])) >= s["accepted"]
    assert all(0.0 <= a <= 1.0 for a in s["per_position_acceptance"])
    assert len(s["per_position_acceptance"]) <= 4
    if kind != "ngram":
        assert s["draft_forwards"] >= s["drafted"] - s["rounds"]
    for key in ("time_draft", "time_verify", "time_sample", "time_total", "tokens_per_s",
                "predicted_speedup", "cost_ratio_c"):
        assert s[key] >= 0.0
    assert s["time_draft"] + s["time_verify"] + s["time_sample"] + s["time_prefill"] <= s["time_total"]


def test_acceptance_is_high_for_a_close_draft_and_low_for_a_far_one():
    close = speculative_generate(TARGET, ModelDrafter(DRAFT_CLOSE), [1, 2, 3], 60, gamma=4).stats
    far = speculative_generate(TARGET, ModelDrafter(DRAFT_FAR), [1, 2, 3], 60, gamma=4).stats
    same = speculative_generate(TARGET, ModelDrafter(TARGET), [1, 2, 3], 60, gamma=4).stats
    assert same["alpha"] == 1.0 and same["tau"] > 4.0
    assert close["alpha"] > far["alpha"]


def test_leviathan_formula():
    assert predicted_speedup(0.0, 4, 0.0) == pytest.approx(1.0)
    assert predicted_speedup(1.0, 4, 0.0) == pytest.approx(5.0)
    # alpha 0.8, gamma 4, c 0.1: (1 - 0.8^5) / (0.2 * 1.4)
    assert predicted_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / 0.2 / 1.4)


def test_adaptive_gamma_rule():
    assert next_gamma(4, 4, 4) == 5
    assert next_gamma(4, 4, 0) == 3
    assert next_gamma(1, 1, 0) == 1
    assert next_gamma(4, 4, 3) == 4
    assert next_gamma(4, 0, 0) == 4


def test_ngram_drafter_proposes_latest_continuation():
    d = NGramDrafter(max_ngram=2)
    cfg = SamplingConfig()
    rng = cfg.make_rng()
    assert d.propose([1, 2, 3, 9, 1, 2, 4, 5, 1, 2], 3, cfg, rng) == ([4, 5, 1], None)
    assert d.propose([1, 2, 3, 4], 3, cfg, rng) == ([], None)
    assert d.propose([5, 6, 5], 4, cfg, rng) == ([6, 5], None)  # unigram fallback, cut at the end


@pytest.mark.parametrize(
    "kwargs, word",
    [({"gamma": 0}, "gamma"), ({"gamma": 2.0}, "gamma"), ({"max_new_tokens": 0}, "max_new_tokens")],
)
def test_bad_arguments_refused(kwargs, word):
    args = {"gamma": 4, "max_new_tokens": 5, **kwargs}
    with pytest.raises(ValueError, match=word):
        speculative_generate(TARGET, DRAFT_CLOSE, [1], args["max_new_tokens"], gamma=args["gamma"])


def test_empty_and_too_long_prompts_refused():
    with pytest.raises(ValueError, match="empty"):
        generate(TARGET, [], 5)
    small = FakeModel(V, seed=1, max_positions=16)
    with pytest.raises(ValueError, match="context"):
        speculative_generate(small, DRAFT_CLOSE, list(range(12)), 5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(TARGET, [1], 0)


def test_streaming_callback_sees_every_token_once():
    seen: list[int] = []
    res = speculative_generate(TARGET, ModelDrafter(DRAFT_CLOSE), [1, 2], 25, gamma=4,
                               on_tokens=seen.extend)
    assert seen == res.tokens
    seen_ar: list[int] = []
    res_ar = generate(TARGET, [1, 2], 25, on_tokens=seen_ar.extend)
    assert seen_ar == res_ar.tokens


def test_sampling_runs_reproduce_with_the_seed():
    cfg = SamplingConfig(temperature=1.0, top_p=0.9, seed=5)
    a = speculative_generate(TARGET, ModelDrafter(DRAFT_CLOSE), [1, 2], 30, cfg, gamma=3).tokens
    b = speculative_generate(TARGET, ModelDrafter(DRAFT_CLOSE), [1, 2], 30, cfg, gamma=3).tokens
    c = speculative_generate(TARGET, ModelDrafter(DRAFT_CLOSE), [1, 2], 30,
                             SamplingConfig(temperature=1.0, top_p=0.9, seed=6), gamma=3).tokens
    assert a == b and a != c


def test_cost_model_speedup_uses_measured_step_and_verify_costs():
    from minitorch.generation.stats import cost_model_speedup, expected_tokens_per_round
    spec = {"token_acceptance": 0.9, "mean_gamma": 4.0, "rounds": 10,
            "time_draft": 3.2, "draft_forwards": 40, "time_verify": 3.3, "target_forwards": 10}
    got = cost_model_speedup(spec, {"time_verify": 2.0, "target_forwards": 10})
    assert got == pytest.approx(expected_tokens_per_round(0.9, 4.0) * 0.2 / (4 * 0.08 + 0.33))
    # a verify pass priced like a step and a free draft reduce it to E[tokens per round]
    free = dict(spec, time_draft=0.0, time_verify=2.0)
    step = {"time_verify": 2.0, "target_forwards": 10}
    assert cost_model_speedup(free, step) == pytest.approx(expected_tokens_per_round(0.9, 4.0))
    assert cost_model_speedup(spec, {"time_verify": 0.0, "target_forwards": 10}) is None
    assert cost_model_speedup(dict(spec, rounds=0), step) is None


def test_cost_model_with_looked_up_drafts():
    """--draft-extend: 3 draft forwards a round for 7 drafts, positions 4-7 (looked up) accepted less often.
    The draft cost is the forwards a round actually made, E comes from the per-position rates; with one rate
    everywhere that E is Leviathan's."""
    from minitorch.generation.stats import cost_model_speedup, expected_tokens_by_position, expected_tokens_per_round
    rates = [0.9, 0.9, 0.9, 0.5, 0.7, 0.8, 0.8]
    spec = {"token_acceptance": 0.6, "mean_gamma": 7.0, "rounds": 10, "per_position_acceptance": rates,
            "time_draft": 2.4, "draft_forwards": 30, "time_verify": 2.6, "target_forwards": 10}
    E = 1 + 0.9 + 0.81 + 0.729 + 0.3645 + 0.25515 + 0.20412 + 0.163296
    assert expected_tokens_by_position(rates) == pytest.approx(E)
    got = cost_model_speedup(spec, {"time_verify": 2.0, "target_forwards": 10})
    assert got == pytest.approx(E * 0.2 / (3 * 0.08 + 0.26))
    assert expected_tokens_by_position([0.8] * 5) == pytest.approx(expected_tokens_per_round(0.8, 5))


@pytest.mark.parametrize("head_vocab", [1, 7, 30])
def test_greedy_with_a_draft_head_subset_equals_target(head_vocab):
    want = generate(TARGET, [1, 2, 3], 40).tokens
    drafter = ModelDrafter(DRAFT_CLOSE, head_vocab=head_vocab)
    res = speculative_generate(TARGET, drafter, [1, 2, 3], 40, gamma=4)
    assert res.tokens == want
    assert all(t < head_vocab for t in drafter_proposals(DRAFT_CLOSE, head_vocab))
    with pytest.raises(ValueError, match="head_vocab"):
        ModelDrafter(DRAFT_CLOSE, head_vocab=0)


def drafter_proposals(model, head_vocab):
    d = ModelDrafter(model, head_vocab=head_vocab)
    d.start([1, 2, 3], 64, model.config.vocab_size)
    toks, q = d.propose([1, 2, 3], 6, SamplingConfig(), np.random.default_rng(0))
    return toks


def test_extended_drafter_continues_the_models_drafts_by_lookup():
    """The model drafts `steps` tokens (greedy: no q), prompt lookup continues context + drafts; sampled:
    the model's q rows, then point masses on the looked-up tokens."""
    ctx = [5, 6, 7, 8, 5, 6]
    model = ModelDrafter(TARGET)
    d = ExtendedDrafter(model, steps=2, then=NGramDrafter(max_ngram=2))
    d.start(ctx, 64, V)
    drafts, q = d.propose(ctx, 5, SamplingConfig(), np.random.default_rng(0))
    m1 = generate(TARGET, ctx, 2).tokens  # the model's own two greedy tokens
    look, _ = NGramDrafter(max_ngram=2).propose(ctx + m1, 3, SamplingConfig(), np.random.default_rng(0))
    assert drafts[:2] == m1 and drafts[2:] == look and len(drafts) <= 5 and q is None
    assert d.forwards == model.forwards == 2
    d.rollback(len(ctx) - 1)
    drafts, q = d.propose(ctx, 4, SamplingConfig(temperature=1.0, seed=1), np.random.default_rng(1))
    assert q.shape == (len(drafts), V) and np.allclose(q.sum(1), 1)
    for i in range(2, len(drafts)):
        assert q[i, drafts[i]] == 1.0  # the looked-up tokens: deterministic drafts
    assert not np.any(q[:2] == 1.0)  # the model's rows are its distributions
    short, _ = d.propose(ctx, 1, SamplingConfig(), np.random.default_rng(0))
    assert len(short) == 1  # gamma below steps: the model's tokens only

