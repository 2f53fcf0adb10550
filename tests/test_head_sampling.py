"""Sampling with a draft head is lossless over several positions, where the target puts much of its mass outside the
head's vocabulary (issue 43): the real HeadDrafter and DraftHead over a tiny real Qwen2 target of 6 token ids, the
head proposing among the first 3 only (q is zero above them, the target still emits all 6). The chi-square harness of
test_generation_distribution.py compares the joint distribution of 4 sampled tokens (the first from the prefill, three
from rounds) with the target's own, enumerated;
a head drafter that reports q at temperature 1 while it samples at the configured one is shown to fail. The same with
the draft budget's gate (budget.py) cutting drafts by the head's confidence: still lossless, and a gate that judges the
drawn draft instead of the distribution it is drawn from is shown to fail."""
from __future__ import annotations


import numpy as np
import pytest

import minitorch
from minitorch import FastBackend
from minitorch.generation import SamplingConfig, logits_to_probs, speculative_generate
from minitorch.generation import head_drafter as hd
from minitorch.generation.budget import CostBudget
from minitorch.generation.head_drafter import HeadDrafter
from minitorch.models.draft_head import DraftHead, DraftHeadConfig
from test_generation_distribution import ALPHA_SIG, pooled_pvalue

V, HEAD_VOCAB, L, N = 6, 3, 4, 3000  # L: the prefill gives the first token, rounds draft the other three
PROMPT = [0, 1, 2, 3, 4, 5, 1, 2]
CFG = {"temperature": 0.3}  # a random head's logits are flat: a low temperature makes its q differ from T = 1


@pytest.fixture(scope="module")
def pair():
    from test_cuda_model import build

    target, _ = build(dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False,
                           rope_theta=10000.0, max_position_embeddings=64), FastBackend, seed=4)
    head = DraftHead(DraftHeadConfig.for_target(target, head_vocab=HEAD_VOCAB, intermediate_size=32), FastBackend,
                     seed=2)
    return target, head


def exact_joint(target, cfg: SamplingConfig) -> dict[tuple[int, ...], float]:
    probs: dict[tuple[int, ...], float] = {(): 1.0}
    with minitorch.no_grad():
        for _ in range(L):
            nxt = {}
            for prefix, pr in probs.items():
                ids = PROMPT + list(prefix)
                row = np.asarray(target(ids, target.new_cache(len(ids))).to_numpy(), np.float64)[0, -1]
                p = logits_to_probs(row, cfg)
                for x in range(V):
                    nxt[prefix + (x,)] = pr * p[x]
            probs = nxt
    return probs


pvalue = pooled_pvalue  # tests/test_generation_distribution.py


GATE = 0.4  # the gate's bar: the head's first top probability here is 0.49 or 0.63, so a first draft is always kept,
# and p after two is 0.34 or 0.43, so a second is kept about half the time


class FixedGate(CostBudget):
    """A gated budget whose every round drafts up to gamma, its gate keeping a draft where p >= GATE (a verify row's
    share of a step; draft steps free), so which drafts are kept depends on each round's confidence. `kept` counts the
    gate's answers."""

    def __init__(self, gamma=3):
        super().__init__(gamma, gated=True)
        self.kept = {True: 0, False: 0}

    def choose(self, accepted, judged):
        self.choices.append(self.gamma)
        return self.gamma

    def row_share(self):
        return GATE

    def draft_share(self):
        return 0.0

    def include(self, n, p):
        keep = super().include(n, p)
        self.kept[keep] += 1
        return keep


def run(target, head, n, seed0=0, gate=None):
    samples, drafted, outside = [], 0, 0
    for seed in range(seed0, seed0 + n):
        res = speculative_generate(target, HeadDrafter(head, target), PROMPT, L, SamplingConfig(seed=seed, **CFG),
                                   gamma=2 if gate is None else gate.gamma, vocab_size=V,
                                   adaptive_gamma=False if gate is None else gate)
        samples.append(tuple(res.tokens))
        drafted += res.stats["drafted"]
        outside += sum(t >= HEAD_VOCAB for t in res.tokens)
    return samples, drafted, outside


@pytest.mark.slow
def test_head_sampling_follows_the_target_over_several_positions(pair):
    target, head = pair
    exact = exact_joint(target, SamplingConfig(**CFG))
    mass_outside = sum(p for seq, p in exact.items() if seq[0] >= HEAD_VOCAB)
    assert mass_outside > 0.3  # the target often wants what the head cannot propose
    samples, drafted, outside = run(target, head, N)
    assert drafted > N and outside > 0.3 * N  # drafts were judged, and tokens outside the head's ids were emitted
    assert pvalue(samples, exact) > ALPHA_SIG


@pytest.mark.slow
def test_a_head_drafter_with_the_wrong_q_is_caught(pair, monkeypatch):
    """Power: a head drafter that draws its drafts at the configured temperature but reports q at temperature 1 (the
    distribution the rule divides by is not the one sampled) fails the same test with half the samples (p 4e-10
    measured, 3e-3 with a quarter; the threshold is 1e-3). A drafter that reports no q at all would not be a bug: a
    sampled draft judged as a point mass, accepted with p(d), is still exact."""
    target, head = pair
    real_probs, real_sample = hd.logits_to_probs, hd.sample
    drawn = {}

    def reported_at_t1(row, cfg):  # the q row the drafter reports; the configured one is kept for the draw
        drawn["p"] = real_probs(row, cfg)
        return real_probs(row, SamplingConfig(temperature=1.0))

    monkeypatch.setattr(hd, "logits_to_probs", reported_at_t1)
    monkeypatch.setattr(hd, "sample", lambda q, rng: real_sample(drawn["p"], rng))
    samples, _, _ = run(target, head, N // 2)
    assert pvalue(samples, exact_joint(target, SamplingConfig(**CFG))) < ALPHA_SIG


@pytest.mark.slow
def test_head_sampling_with_the_gate_cutting_drafts_follows_the_target(pair):
    target, head = pair
    gate = FixedGate()
    samples, drafted, _ = run(target, head, N, gate=gate)
    assert gate.kept[True] > N and gate.kept[False] > N // 4  # drafts were kept and cut
    assert pvalue(samples, exact_joint(target, SamplingConfig(**CFG))) > ALPHA_SIG


@pytest.mark.slow
def test_a_gate_that_judges_the_drawn_draft_is_caught(pair, monkeypatch):
    """Power: a gate that keeps a draft by the probability of the token drawn (p * q(d)) instead of the distribution's
    top one (known before the draw) keeps likely draws and drops unlikely ones, so a kept draft is no longer a draw from
    q and the rule's p / q is wrong; it fails the test above with half the samples."""
    target, head = pair
    real_probs, real_sample = hd.logits_to_probs, hd.sample
    state = {"rng": np.random.default_rng(7)}

    def probs(row, cfg):
        state["q"] = real_probs(row, cfg)
        return state["q"]

    class JudgesTheDraw(FixedGate):
        def include(self, n, p):
            if n == 1:
                state["p"] = 1.0
            state["tok"] = real_sample(state["q"], state["rng"])  # draw first ...
            state["p"] *= float(state["q"][state["tok"]])
            keep = state["p"] >= GATE  # ... then judge the draw
            self.kept[keep] += 1
            return keep

    monkeypatch.setattr(hd, "logits_to_probs", probs)
    monkeypatch.setattr(hd, "sample", lambda q, rng: state["tok"])
    gate = JudgesTheDraw()
    samples, _, _ = run(target, head, N // 2, gate=gate)
    assert gate.kept[False] > 0
    assert pvalue(samples, exact_joint(target, SamplingConfig(**CFG))) < ALPHA_SIG
