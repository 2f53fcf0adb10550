"""Speculative sampling follows the target's distribution exactly (the lossless guarantee).

Setup: vocabulary of 4 tokens, a target and an unrelated draft (so p and q differ a lot), both tiny
numpy models. For each sampling configuration we run N = 6,000 speculative generations of 4 tokens
(gamma 3: the first round drafts 3 tokens, so positions 1-3 come from accepted drafts or residual
resamples, position 4 from a bonus or a later round) with seeds 0..N-1, and compare the empirical
joint distribution of the 4 tokens (256 cells) with the exact target distribution, enumerated from
the target's own probabilities. Pearson chi-square, cells with expected count < 5 pooled;
significance 0.001 (a correct sampler fails with probability 0.1% per case, and the seeds are
fixed, so the outcome is deterministic). The same test must reject deliberately broken samplers, which
shows it has power: resampling from p instead of norm(max(p - q, 0)) (at N, on 2 cases), and, at N / 4
samples (less power than the real test has), accepting with probability p instead of min(1, p/q), the
ratio the wrong way round (q/p, residual max(q - p)), the bonus token drawn from the last draft's row
instead of the row after it, and a model drafter whose reported q lacks the sampling settings (q at
temperature 1 without top-k, drafts drawn with them). Each of these fails with p < 1e-9 (measured; the
threshold is 1e-3).
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import minitorch.generation.speculative as spec
import minitorch.generation.drafters as drafters
from minitorch.generation import ExtendedDrafter, ModelDrafter, NGramDrafter, SamplingConfig, logits_to_probs
from test_generation_fakes import FakeModel

V = 4
L = 4
N = 6000
ALPHA_SIG = 1e-3
TARGET = FakeModel(V, hidden=8, seed=21, scale=1.5)
DRAFT = FakeModel(V, hidden=8, seed=22, scale=1.5)
PROMPT = [0, 1, 2, 3, 0, 1, 2]  # repetitive, so the n-gram drafter finds matches


def pooled_pvalue(samples, exact) -> float:
    """Chi-square p-value of samples (hashable cells) against the exact cell probabilities (a dict), the cells
    expecting fewer than 5 samples pooled into one; 0 when a sample falls in a cell of probability 0."""
    counts: dict = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    if any(exact.get(s, 0.0) <= 0.0 for s in counts):
        return 0.0
    n, stat, dof, pe, po = len(samples), 0.0, -1, 0.0, 0
    for cell, p in exact.items():
        e, o = n * p, counts.get(cell, 0)
        if e < 5.0:
            pe, po = pe + e, po + o
            continue
        stat, dof = stat + (o - e) ** 2 / e, dof + 1
    if pe > 0:
        stat, dof = stat + (po - pe) ** 2 / pe, dof + 1
    return chi2_sf(stat, dof)


def chi2_sf(x: float, k: int) -> float:
    """P(X > x) for X ~ chi-square(k) = regularized upper gamma Q(k/2, x/2): the series for
    P below a + 1, Lentz's continued fraction for Q above (Numerical Recipes 6.2)."""
    a, z = k / 2.0, x / 2.0
    if z <= 0:
        return 1.0
    log_pre = -z + a * math.log(z) - math.lgamma(a)
    if z < a + 1.0:
        term = total = 1.0 / a
        n = 1
        while term > total * 1e-15:
            term *= z / (a + n)
            total += term
            n += 1
        return max(0.0, 1.0 - math.exp(log_pre) * total)
    tiny = 1e-300
    b = z + 1.0 - a
    c, d = 1.0 / tiny, 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return math.exp(log_pre) * h


def exact_joint(cfg: SamplingConfig) -> dict[tuple[int, ...], float]:
    """P(x_1..x_L | PROMPT) under the target with the configured processors, by enumeration."""
    probs: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(L):
        nxt: dict[tuple[int, ...], float] = {}
        for prefix, pr in probs.items():
            if pr == 0.0:
                continue
            ids = PROMPT + list(prefix)
            row = TARGET(ids, TARGET.new_cache(len(ids)))[0, -1]
            p = logits_to_probs(row, cfg)
            for x in range(V):
                nxt[prefix + (x,)] = pr * p[x]
        probs = nxt
    return probs


def chi_square_pvalue(samples: list[tuple[int, ...]], exact: dict[tuple[int, ...], float]) -> float:
    n = len(samples)
    counts: dict[tuple[int, ...], int] = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    assert all(exact.get(s, 0.0) > 0.0 for s in counts), "sampled a sequence of probability 0"
    stat, dof, pooled_e, pooled_o = 0.0, -1, 0.0, 0
    for cell in itertools.product(range(V), repeat=L):
        e = n * exact.get(cell, 0.0)
        o = counts.get(cell, 0)
        if e < 5.0:
            pooled_e += e
            pooled_o += o
            continue
        stat += (o - e) ** 2 / e
        dof += 1
    if pooled_e > 0:
        stat += (pooled_o - pooled_e) ** 2 / pooled_e
        dof += 1
    return chi2_sf(stat, dof)


def run_samples(cfg_kwargs: dict, drafter_kind: str, n: int = N) -> list[tuple[int, ...]]:
    out = []
    for seed in range(n):
        cfg = SamplingConfig(seed=seed, **cfg_kwargs)
        if drafter_kind == "model-head":  # drafts only among tokens 0..V-2; the target still emits V-1
            drafter = ModelDrafter(DRAFT, head_vocab=V - 1)
        elif drafter_kind == "model+lookup":  # one sampled model token, then deterministic n-gram tokens
            drafter = ExtendedDrafter(ModelDrafter(DRAFT), steps=1, then=NGramDrafter(max_ngram=3))
        else:
            drafter = ModelDrafter(DRAFT) if drafter_kind == "model" else NGramDrafter(max_ngram=3)
        res = spec.speculative_generate(TARGET, drafter, PROMPT, L, cfg, gamma=3)
        out.append(tuple(res.tokens))
    return out


CASES = [
    ({"temperature": 1.0}, "model"),
    ({"temperature": 0.7, "top_k": 3}, "model"),
    ({"temperature": 1.3, "top_p": 0.8}, "model"),
    ({"temperature": 1.0}, "ngram"),
    ({"temperature": 1.0}, "model-head"),
    ({"temperature": 1.0}, "model+lookup"),
]


def test_chi2_sf_known_values():
    assert chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, abs=1e-9)
    assert chi2_sf(18.307038053275146, 10) == pytest.approx(0.05, abs=1e-9)
    assert chi2_sf(0.0, 4) == 1.0
    assert chi2_sf(2.0, 2) == pytest.approx(math.exp(-1.0), rel=1e-12)  # chi2(2) is Exp(1/2)
    assert chi2_sf(40.0, 2) == pytest.approx(math.exp(-20.0), rel=1e-9)
    assert chi2_sf(5000.0, 100) < 1e-300


@pytest.mark.slow
@pytest.mark.parametrize("cfg_kwargs, drafter_kind", CASES)
def test_speculative_samples_follow_the_target(cfg_kwargs, drafter_kind):
    exact = exact_joint(SamplingConfig(**cfg_kwargs))
    pval = chi_square_pvalue(run_samples(cfg_kwargs, drafter_kind), exact)
    assert pval > ALPHA_SIG, f"speculative samples differ from the target: p = {pval:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("cfg_kwargs, drafter_kind", [CASES[0], CASES[3]])
def test_broken_residual_is_detected(cfg_kwargs, drafter_kind, monkeypatch):
    monkeypatch.setattr(spec, "residual_distribution", lambda p, q: p)  # the classic bug
    exact = exact_joint(SamplingConfig(**cfg_kwargs))
    pval = chi_square_pvalue(run_samples(cfg_kwargs, drafter_kind), exact)
    assert pval < ALPHA_SIG, f"the test failed to detect a broken sampler: p = {pval:.2e}"


@pytest.mark.slow
def test_extended_drafter_with_wrong_lookup_q_is_detected(monkeypatch):
    """The looked-up tokens' q rows must be point masses: uniform rows in their place (the acceptance ratio
    then p / (1/V)) bias the samples, and the test sees it."""
    monkeypatch.setattr(drafters, "point_mass_rows", lambda tokens, vocab: np.full((len(tokens), vocab), 1.0 / vocab))
    exact = exact_joint(SamplingConfig(temperature=1.0))
    pval = chi_square_pvalue(run_samples({"temperature": 1.0}, "model+lookup", N // 4), exact)
    assert pval < ALPHA_SIG, f"the test failed to detect a wrong q for looked-up tokens: p = {pval:.2e}"


def test_draft_and_target_differ_enough():
    # the power argument needs p != q: total variation between the first-step distributions
    cfg = SamplingConfig(temperature=1.0)
    p = logits_to_probs(TARGET(PROMPT, TARGET.new_cache(len(PROMPT)))[0, -1], cfg)
    q = logits_to_probs(DRAFT(PROMPT, DRAFT.new_cache(len(PROMPT)))[0, -1], cfg)
    assert 0.5 * np.abs(p - q).sum() > 0.2


# ---- broken samplers: each one an ordinary-looking slip in speculative.py / drafters.py -----------------
def _accept(rows, drafts, q, cfg, rng, accept, residual, bonus_row):
    """accept_sampled with its three decisions replaceable."""
    for i, d in enumerate(drafts):
        p = logits_to_probs(rows[i], cfg)
        q_i = np.zeros_like(p)
        if q is None:
            q_i[d] = 1.0
        else:
            q_i = q[i]
        if accept(rng.random(), p[d], q_i[d]):
            continue
        return i, spec.sample(residual(p, q_i), rng)
    return len(drafts), spec.sample(logits_to_probs(rows[bonus_row(len(drafts))], cfg), rng)


def _propose_q_without_settings(self, tokens, gamma, cfg, rng):
    """ModelDrafter.propose drawing drafts with the settings but reporting q = softmax(logits)."""
    from minitorch.generation.sampling import logits_rows, sample

    feed = self._sync(tokens)
    drafts, qs = [], []
    for _ in range(gamma):
        rows = logits_rows(self.model(feed, self.cache), self._vocab)
        self.forwards += 1
        self._ids.extend(feed)
        drafts.append(sample(logits_to_probs(rows[-1], cfg), rng))
        qs.append(logits_to_probs(rows[-1], SamplingConfig(temperature=1.0)))  # the slip
        feed = [drafts[-1]]
    return drafts, np.stack(qs)


def _good_accept(u, p, q):
    return u * q < p


def _good_residual(p, q):
    return spec.residual_distribution(p, q)


BROKEN = {
    "accept-without-q": ("accept_sampled", lambda r, d, q, c, g: _accept(
        r, d, q, c, g, lambda u, p, qd: u < p, _good_residual, lambda n: n)),
    "p-q-swapped": ("accept_sampled", lambda r, d, q, c, g: _accept(
        r, d, q, c, g, lambda u, p, qd: u * p < qd, lambda p, q: spec.residual_distribution(q, p), lambda n: n)),
    "bonus-from-last-draft-row": ("accept_sampled", lambda r, d, q, c, g: _accept(
        r, d, q, c, g, _good_accept, _good_residual, lambda n: max(n - 1, 0))),
    "q-without-settings": ("propose", _propose_q_without_settings),
}
# the case where each slip matters: q = 1 for the n-gram drafter (so "without q" is harmless there), and the
# sampling settings must change q for the last one
BROKEN_CASES = [("accept-without-q", CASES[0]), ("p-q-swapped", CASES[3]), ("bonus-from-last-draft-row", CASES[3]),
                ("q-without-settings", CASES[1])]


def test_the_unbroken_rule_passes_through_the_replaceable_one():
    """_accept with the real decisions draws exactly what accept_sampled draws (same rng stream)."""
    rng_rows = np.random.default_rng(0)
    for trial in range(50):
        rows = rng_rows.normal(size=(4, V))
        q = np.stack([logits_to_probs(rng_rows.normal(size=V), SamplingConfig(temperature=1.0)) for _ in range(3)])
        drafts = [int(x) for x in rng_rows.integers(0, V, 3)]
        cfg = SamplingConfig(temperature=1.0)
        for qq in (q, None):
            a = spec.accept_sampled(rows, drafts, qq, cfg, np.random.default_rng(trial))
            b = _accept(rows, drafts, qq, cfg, np.random.default_rng(trial), _good_accept, _good_residual, lambda n: n)
            assert a == b


@pytest.mark.parametrize("bug, case", BROKEN_CASES, ids=[b for b, _ in BROKEN_CASES])
def test_broken_samplers_are_detected(bug, case, monkeypatch):
    import minitorch.generation.drafters as dr

    name, fn = BROKEN[bug]
    monkeypatch.setattr(dr.ModelDrafter if name == "propose" else spec, name, fn)
    cfg_kwargs, drafter_kind = case
    exact = exact_joint(SamplingConfig(**cfg_kwargs))
    try:
        pval = chi_square_pvalue(run_samples(cfg_kwargs, drafter_kind, N // 4), exact)
    except AssertionError:  # a sequence of probability 0 was sampled: detected as well
        pval = 0.0
    assert pval < ALPHA_SIG, f"the test failed to detect {bug}: p = {pval:.2e}"
