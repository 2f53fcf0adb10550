"""The device acceptance test's statistics have power (tests/test_cuda_sampling.py, GPU only), shown on the CPU.

test_acceptance_emits_target_distributed_tokens runs kernels/sampling.cu's spec_accept 12,000 times on fixed
p, q and drafts and checks the output with `check_acceptance`. Here the same inputs go through the CPU rule
(minitorch.generation.speculative.accept_sampled, which the chi-square distribution test validates against
the exact target distribution) and through broken rules: `check_acceptance` must pass the first and reject
each of the others, so a device kernel with one of these bugs fails the GPU test.
"""
from __future__ import annotations

import numpy as np
import pytest

import minitorch.generation.speculative as spec
from minitorch.generation import SamplingConfig
from test_cuda_sampling import acceptance_inputs, check_acceptance
from test_generation_distribution import BROKEN


def simulate(accept, p, q, drafts, seed=5) -> np.ndarray:
    """spec_accept's output format from a CPU acceptance rule: [n, d_1..d_n, next, 0...] per row."""
    rows = np.log(p)  # logits whose softmax at temperature 1 is p
    cfg = SamplingConfig(temperature=1.0)
    rng = np.random.default_rng(seed)
    g = drafts.shape[1]
    out = np.zeros((drafts.shape[0], g + 2), np.int64)
    for i, d in enumerate(drafts):
        n, nxt = accept(rows, [int(x) for x in d], q, cfg, rng)
        out[i, 0] = n
        out[i, 1:1 + n] = d[:n]
        out[i, 1 + n] = nxt
    return out


@pytest.mark.parametrize("point_mass", [False, True], ids=["model-draft", "point-mass"])
def test_cpu_rule_passes_the_device_check(point_mass):
    p, q, drafts = acceptance_inputs(point_mass, 1)
    check_acceptance(simulate(spec.accept_sampled, p, q, drafts), p, q, drafts)


def _residual_p(rows, drafts, q, cfg, rng, real=spec.accept_sampled):
    old = spec.residual_distribution
    spec.residual_distribution = lambda p_, q_: p_
    try:
        return real(rows, drafts, q, cfg, rng)
    finally:
        spec.residual_distribution = old


RULES = {name: fn for name, (slot, fn) in BROKEN.items() if slot == "accept_sampled"}
RULES["residual-is-p"] = _residual_p
# accepting without q is harmless for point-mass drafts (q = 1 there), as on the CPU
CASES = [(name, pm) for name in RULES for pm in (False, True) if not (name == "accept-without-q" and pm)]


@pytest.mark.parametrize("name, point_mass", CASES, ids=[f"{n}-{'point-mass' if pm else 'model-draft'}" for n, pm in CASES])
def test_broken_rules_fail_the_device_check(name, point_mass):
    p, q, drafts = acceptance_inputs(point_mass, 1)
    with pytest.raises(AssertionError):
        check_acceptance(simulate(RULES[name], p, q, drafts), p, q, drafts)


# ---- the draws test (sample_f32): its chi-square against slightly wrong distributions ------------------------
def _wrong_cfgs(case: dict) -> dict:
    """Realistic slips for a case: temperature applied as 0.9x, top-k one too many, top-p keeping a token too many."""
    out = {"temperature-0.9x": dict(case, temperature=case["temperature"] * 0.9)}
    if case.get("top_k"):
        out["top-k+1"] = dict(case, top_k=case["top_k"] + 1)
    if case.get("top_p", 1.0) < 1.0:
        out["top-p-one-more"] = None  # built from the reference below
    return out


@pytest.mark.parametrize("C", [1, 16], ids=["1-block", "cluster-16"])
@pytest.mark.parametrize("k", range(3), ids=["t1", "topk6", "topp0.7"])
def test_draws_check_rejects_slightly_wrong_samplers(k, C):
    from minitorch.generation import logits_to_probs
    from test_cuda_sampling import DRAW_CASES, SIG, chi2_pvalue, draws_inputs

    case = DRAW_CASES[k]
    logits, N = draws_inputs(C)
    V = logits.shape[1]
    ref = logits_to_probs(logits[0], SamplingConfig(**case))
    rng = np.random.default_rng(11)
    right = np.bincount(rng.choice(V, size=N, p=ref), minlength=V)
    assert chi2_pvalue(right, ref) > SIG
    for name, wrong_case in _wrong_cfgs(case).items():
        if wrong_case is None:  # the nucleus plus the next most likely token
            kept = np.flatnonzero(ref > 0)
            extra = np.argsort(-np.where(ref > 0, -np.inf, logits[0]))[0]
            wrong = np.zeros(V)
            full = logits_to_probs(logits[0], SamplingConfig(temperature=case["temperature"]))
            wrong[kept], wrong[extra] = full[kept], full[extra]
            wrong /= wrong.sum()
        else:
            wrong = logits_to_probs(logits[0], SamplingConfig(**wrong_case))
        if np.allclose(wrong, ref, atol=1e-12):  # harmless here (a nucleus of one token at either temperature)
            continue
        counts = np.bincount(rng.choice(V, size=N, p=wrong), minlength=V)
        try:
            pval = chi2_pvalue(counts, ref)
        except AssertionError:  # drew a token of probability 0: the device test fails as well
            pval = 0.0
        assert pval < SIG, (name, pval)


def test_narrow_draft_rule_passes_and_a_row_overrun_fails():
    """A draft that proposes among the first Vq < V tokens (--draft-vocab): its q rows hold Vq entries and q = 0
    beyond. The right rule (q padded with zeros) passes the device check; reading V entries of a Vq-wide row
    (the next row's first entries where zeros belong: the bug the kernel's qV bound prevents) fails it."""
    p, q, drafts = acceptance_inputs(False, 1, narrow=True)
    V, Vq = p.shape[1], q.shape[1]
    padded = np.pad(q, ((0, 0), (0, V - Vq)))
    check_acceptance(simulate(spec.accept_sampled, p, padded, drafts), p, q, drafts)
    flat = np.concatenate([q.ravel(), np.zeros(V)])
    overrun = np.stack([flat[i * Vq:i * Vq + V] for i in range(q.shape[0])])
    with pytest.raises(AssertionError):
        check_acceptance(simulate(spec.accept_sampled, p, overrun, drafts), p, q, drafts)


def _lookup_q(q, drafts, rows_for_lookups):
    """The model's q rows then, for the looked-up drafts (the same tokens in every row here), the given rows."""
    return np.concatenate([q, rows_for_lookups(drafts[0, q.shape[0]:], q.shape[1])])


def test_lookup_drafts_pass_the_device_check_as_point_masses_only():
    """A draft model's token continued by two looked-up tokens (kernels/sampling.cu spec_accept with gq < g):
    the CPU rule with point masses for the looked-up tokens passes check_acceptance; with uniform q rows
    there (what a kernel reading the model's ring past its gq rows could amount to) it fails."""
    from minitorch.generation.drafters import point_mass_rows

    p, q, drafts = acceptance_inputs(False, 1, model_rows=1)
    check_acceptance(simulate(spec.accept_sampled, p, _lookup_q(q, drafts, point_mass_rows), drafts), p, q, drafts)
    uniform = _lookup_q(q, drafts, lambda toks, V: np.full((len(toks), V), 1.0 / V))
    with pytest.raises(AssertionError):
        check_acceptance(simulate(spec.accept_sampled, p, uniform, drafts), p, q, drafts)
