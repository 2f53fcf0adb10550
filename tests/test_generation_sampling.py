"""Sampling: config validation, processors against transformers' logits warpers, the sampler itself."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minitorch.generation import SamplingConfig, logits_to_probs, sample
from minitorch.generation.sampling import logits_rows, next_token


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"seed": -3}, "seed"),
    ],
)
def test_invalid_sampling_values_refused(kwargs, word):
    with pytest.raises(ValueError, match=word):
        SamplingConfig(**kwargs)


def test_greedy_is_argmax_one_hot():
    row = np.array([0.1, 3.0, 3.0, -1.0], dtype=np.float32)
    cfg = SamplingConfig()
    assert cfg.greedy
    np.testing.assert_array_equal(logits_to_probs(row, cfg), [0, 1, 0, 0])  # first max wins
    assert next_token(row, cfg, cfg.make_rng()) == 1


def _hf_probs(row: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """transformers' own warpers (temperature -> top-k -> top-p), as the oracle."""
    torch = pytest.importorskip("torch")
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

    x = torch.tensor(row, dtype=torch.float64)[None]
    x = TemperatureLogitsWarper(temperature)(None, x)
    if top_k:
        x = TopKLogitsWarper(top_k)(None, x)
    if top_p < 1.0:
        x = TopPLogitsWarper(top_p)(None, x)
    return torch.softmax(x, dim=-1)[0].numpy()


@given(
    seed=st.integers(0, 10_000),
    vocab=st.integers(2, 40),
    temperature=st.sampled_from([0.3, 0.7, 1.0, 1.6]),
    top_k=st.integers(0, 12),
    top_p=st.sampled_from([1.0, 0.95, 0.8, 0.5, 0.1]),
)
def test_processors_match_transformers(seed, vocab, temperature, top_k, top_p):
    row = np.random.default_rng(seed).normal(scale=3.0, size=vocab).astype(np.float32)
    cfg = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    ours = logits_to_probs(row, cfg)
    ref = _hf_probs(row, temperature, top_k, top_p)
    np.testing.assert_allclose(ours, ref, atol=1e-9)
    assert abs(ours.sum() - 1.0) < 1e-12


@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.99, 0.999999])
@pytest.mark.parametrize("scale", [1.0, 4.0])
def test_top_p_on_a_large_vocabulary_matches_transformers(top_p, scale):
    # large enough that the nucleus search works on a partial sort (k < V) or grows to all of it
    row = np.random.default_rng(1).standard_t(df=3, size=5000).astype(np.float32) * scale
    cfg = SamplingConfig(temperature=1.0, top_p=top_p)
    np.testing.assert_allclose(logits_to_probs(row, cfg), _hf_probs(row, 1.0, 0, top_p), atol=1e-9)


FREQ_PROBS = np.array([0.5, 0.0, 0.3, 0.15, 0.05])


def _check_sample_frequencies(sampler) -> None:
    """40,000 draws from a known 5-way distribution: each frequency within 5 standard errors. For a correct
    sampler a cell leaves that band with probability 5.7e-7 (normal two-sided tail; binomial counts of
    >= 2,000 expected), so the 4 cells fail together with p < 2.3e-6; the seed is fixed, so the outcome is
    deterministic."""
    probs = FREQ_PROBS
    rng = np.random.default_rng(123)
    n = 40_000
    counts = np.bincount([sampler(probs, rng) for _ in range(n)], minlength=5)
    assert counts[1] == 0
    se = np.sqrt(probs * (1 - probs) / n)
    assert np.all(np.abs(counts / n - probs) <= 5 * se + 1e-12)


def test_sample_frequencies_match_probs():
    _check_sample_frequencies(sample)


@pytest.mark.parametrize("bug", ["temperature-slip", "off-by-one", "zero-prob-drawn"])
def test_broken_samplers_fail_the_frequency_check(bug):
    """A sampler that sharpens the distribution (probs ** 1.11: a temperature of 0.9 applied twice), one
    that returns the token after the drawn one, and one that returns a zero-probability token once in a
    thousand draws (a float edge case without the skip) all fail."""
    def broken(probs, rng):
        if bug == "temperature-slip":
            return sample(probs ** (1 / 0.9) / (probs ** (1 / 0.9)).sum(), rng)
        if bug == "off-by-one":
            return min(sample(probs, rng) + 1, probs.shape[0] - 1)
        return sample(probs, rng) if rng.random() < 0.999 else 1
    with pytest.raises(AssertionError):
        _check_sample_frequencies(broken)


def test_same_seed_same_tokens():
    row = np.random.default_rng(0).normal(size=100)
    cfg = SamplingConfig(temperature=1.0, seed=7)
    a = [next_token(row, cfg, r) for r in [cfg.make_rng()] for _ in range(20)]
    b = [next_token(row, cfg, r) for r in [cfg.make_rng()] for _ in range(20)]
    assert a == b


def test_logits_rows_shape_and_vocab_cut():
    arr = np.arange(24, dtype=np.float32).reshape(1, 3, 8)
    assert logits_rows(arr, 5).shape == (3, 5)
    with pytest.raises(ValueError, match=r"\(1, T, V\)"):
        logits_rows(arr[0])


# ---- top-k / top-p edges: ties and exact boundaries ----------------------------------------------------------
TIED = np.array([3, 1, 3, 2, 2, 2, 0, 3, 1, 2], dtype=np.float32)  # ties at every level


def _check_top_k_ties(impl) -> None:
    """Ties at the k-th value are all kept, as transformers' TopKLogitsWarper does; k >= V is off."""
    for top_k in (1, 2, 3, 4, 5, 9, 10, 40):
        want = _hf_probs(TIED, 1.0, top_k, 1.0)
        np.testing.assert_allclose(impl(TIED, SamplingConfig(temperature=1.0, top_k=top_k)), want, atol=1e-12,
                                   err_msg=f"top_k={top_k}")


def _check_top_p_edges(impl) -> None:
    """The smallest set of most likely tokens whose mass reaches top_p, the crossing token included, ties in
    token-id order: probabilities 1/2, 1/4, 1/4 (exact in binary) and top_p = 3/4 keep ids 0 and 1."""
    row = np.log(np.array([0.25, 0.5, 0.125, 0.125], dtype=np.float64)).astype(np.float32)
    cases = [(0.75, [1, 0]), (0.5, [1]), (0.51, [1, 0]), (0.875, [1, 0, 2]), (0.9, [1, 0, 2, 3]), (1e-9, [1])]
    for top_p, kept in cases:
        got = impl(row, SamplingConfig(temperature=1.0, top_p=top_p))
        want = np.zeros(4)
        p = np.array([0.25, 0.5, 0.125, 0.125])
        want[kept] = p[kept] / p[kept].sum()
        np.testing.assert_allclose(got, want, atol=1e-12, err_msg=f"top_p={top_p}")


def test_top_k_keeps_ties_like_transformers():
    _check_top_k_ties(logits_to_probs)


def test_top_p_exact_boundaries_and_ties():
    _check_top_p_edges(logits_to_probs)


def _strict_top_k(row, cfg):
    """Exactly k tokens (argsort), dropping the other tokens tied at the k-th value."""
    x = row.astype(np.float64) / cfg.temperature
    if 0 < cfg.top_k < x.shape[0]:
        keep = np.argsort(-x, kind="stable")[:cfg.top_k]
        x = np.where(np.isin(np.arange(x.shape[0]), keep), x, -np.inf)
    e = np.exp(x - x.max())
    return e / e.sum()


def _top_p_stops_before_crossing(row, cfg):
    """Keeps only the tokens whose cumulative mass stays below top_p (the crossing token dropped)."""
    p = logits_to_probs(row, SamplingConfig(temperature=cfg.temperature))
    order = np.argsort(-p, kind="stable")
    n = max(1, int(np.searchsorted(np.cumsum(p[order]), cfg.top_p - 1e-12, side="left")))
    out = np.zeros_like(p)
    out[order[:n]] = p[order[:n]]
    return out / out.sum()


def _top_p_ties_by_argsort_default(row, cfg):
    """Nucleus with ties ordered by numpy's default (unstable) sort, from the highest id down."""
    p = logits_to_probs(row, SamplingConfig(temperature=cfg.temperature))
    order = np.argsort(-p[::-1], kind="stable")
    order = (p.shape[0] - 1 - order)
    n = int(np.searchsorted(np.cumsum(p[order]), cfg.top_p - 1e-12, side="left")) + 1
    out = np.zeros_like(p)
    out[order[:n]] = p[order[:n]]
    return out / out.sum()


@pytest.mark.parametrize("broken, check", [(_strict_top_k, _check_top_k_ties),
                                           (_top_p_stops_before_crossing, _check_top_p_edges),
                                           (_top_p_ties_by_argsort_default, _check_top_p_edges)],
                         ids=["strict-top-k", "top-p-without-crossing-token", "top-p-ties-high-ids-first"])
def test_edge_checks_catch_broken_filters(broken, check):
    with pytest.raises(AssertionError):
        check(broken)
