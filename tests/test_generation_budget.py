"""The draft budget (minitorch/generation/budget.py): each round drafts 0..gamma by the measured acceptance and
costs. Its choices against the expected-tokens-a-second rule worked by hand; greedy output equal to the target
alone's whatever it chooses; sampled output still the target's distribution (the chi-square harness of
test_generation_distribution.py, with costs fixed so the choices are reproducible and depend on each seed's own
acceptance history); a drafter that never pays goes plain, one that always pays drafts gamma."""
from __future__ import annotations

import pytest

import minitorch.generation.speculative as spec
from minitorch.generation import ModelDrafter, SamplingConfig, generate, speculative_generate
from minitorch.generation.budget import GAIN_MIN, PROBE_MAX, PROBE_MIN, CostBudget
from test_generation_fakes import FakeModel


class FixedCosts(CostBudget):
    """The budget with made-up seconds instead of measured ones: draft step t_d, verify 1 + slope * (rows - 1)."""

    def __init__(self, gamma, t_d=0.3, slope=0.1, **kw):
        super().__init__(gamma, **kw)
        self.t_d, self.slope = t_d, slope

    def record(self, drafted, draft_forwards, draft_seconds, verify_seconds, emitted=1):
        super().record(drafted, draft_forwards, self.t_d * draft_forwards, 1.0 + self.slope * drafted, emitted)


def test_choices_follow_expected_tokens_per_second():
    b = FixedCosts(4, t_d=0.3, slope=0.1)
    assert b.choose([], []) == 4  # the first round, the warm-up, drafts gamma; its seconds are not learnt ...
    b.record(4, 4, 0, 0)
    assert b.t_draft is None and not b.t_verify and b.choose([], []) == 4  # ... so the second drafts gamma too ...
    b.record(4, 4, 0, 0)
    assert b.t_draft == pytest.approx(0.3)
    assert b.choose([9, 8, 7, 6], [10, 9, 8, 7]) == 0  # ... the third none: both ends of the verify line
    b.record(0, 0, 0, 0)
    acc, judged = [90, 80, 70, 60], [100, 90, 80, 70]
    rates = {g: b.expected_tokens(g, acc, judged) / (g * 0.3 + 1 + 0.1 * g) for g in range(5)}
    assert b.choose(acc, judged) == max(rates, key=rates.get) == 3  # a 4th draft costs more than it brings
    assert b.verify_seconds(3) == pytest.approx(1.2)  # interpolated between rows 1 and 5
    assert b.choose([1, 0, 0, 0], [20, 1, 0, 0]) == 0  # a_1 = 3 / 22: drafting loses to a plain step


def test_least_keeps_every_round_drafting():
    """least=1 (the CUDA-graph engine's budget): the second round drafts one, not none, and where drafting loses the
    choice is one draft a round, never a plain step; where it pays, the same choice as without the floor."""
    b = FixedCosts(4, t_d=0.3, slope=0.1, least=1)
    for _ in range(2):  # the warm-up round and the one that measures
        assert b.choose([], []) == 4
        b.record(4, 4, 0, 0)
    assert b.choose([9, 8, 7, 6], [10, 9, 8, 7]) == 1  # the cheap end of the line, measured
    b.record(1, 1, 0, 0)
    assert b.choose([1, 0, 0, 0], [20, 1, 0, 0]) == 1  # drafting loses: the fewest drafts, not a plain step
    acc, judged = [90, 80, 70, 60], [100, 90, 80, 70]
    assert b.choose(acc, judged) == 3  # drafting pays: as without the floor (test above)
    with pytest.raises(ValueError):
        CostBudget(4, least=5)


def test_the_warm_up_rounds_seconds_are_not_learnt():
    """The first round runs cold (seen on the CPU: a 4-row verify of 118 ms against 88 warm): its seconds stay out of
    the running means, so a head whose warm rounds pay keeps drafting instead of going plain for good."""
    b = CostBudget(3)
    acc, judged = [70, 60, 50], [100, 70, 42]
    b.choose([], []), b.record(3, 3, 0.36, 0.118)  # cold: 120 ms a draft step, a dear verify
    b.choose([], []), b.record(3, 3, 0.012, 0.088)  # warm: 4 ms a step
    assert b.t_draft == pytest.approx(0.004) and b.t_verify == {4: pytest.approx(0.088)}
    b.choose(acc, judged), b.record(0, 0, 0.0, 0.063)
    assert b.choose(acc, judged) == 3


def test_rarely_judged_positions_follow_the_one_before():
    """A position judged once keeps little of that one judgement: its rate moves with the first position's, so a
    run whose first drafts are nearly always accepted goes on to try longer drafts."""
    b = CostBudget(4)
    a = b.rates(4, [98, 0, 0, 0], [100, 1, 1, 1])  # one early round rejected position 2
    assert a[0] == pytest.approx(99 / 102) and a[1] == pytest.approx(2 * a[0] / 3) and a[3] < a[2] < a[1]
    assert b.rates(2, [98, 90], [100, 92])[1] == pytest.approx((90 + 2 * 99 / 102) / 94)


def test_probes_stay_within_their_share_of_the_time():
    """Where drafting loses, a probe (one draft) comes after PROBE_MIN plain rounds only while the first round's and
    the probes' extra seconds stay within EXPLORE of the run: a dear probe (a model drafter catching up) is rare."""
    b = CostBudget(4, explore=0.05, probe_min=3)
    b.choose([], []), b.record(4, 4, 0.4, 1.4, emitted=1)  # the first round: 1.8 s for one token (plain: 1.4 / 5)
    b.choose([], []), b.record(4, 4, 0.4, 1.4, emitted=1)  # the second: the same, its seconds learnt
    b.choose([], []), b.record(0, 0, 0.0, 1.0)
    seen = []
    for _ in range(120):
        g = b.choose([0], [30])
        seen.append(g)
        b.record(g, g, 0.6 * g, 1.0 + 0.1 * g)  # a probe: 0.6 s of drafting and a dearer verify for one token
    probes = [i for i, g in enumerate(seen) if g]
    assert probes and probes[0] >= 3 and all(b - a > 3 for a, b in zip(probes, probes[1:]))
    assert b.explored <= 0.05 * b.elapsed + b.probe_cost  # at most one probe past the share
    assert len(probes) < 10


@pytest.mark.parametrize("noise, t_d, want", [(0.0, 0.05, "drafts"), (3.0, 2.0, "plain")])
def test_a_drafter_that_pays_drafts_and_one_that_does_not_goes_plain(noise, t_d, want):
    target = FakeModel(20, seed=1)
    draft = target if noise == 0.0 else FakeModel(20, seed=5)
    b = FixedCosts(4, t_d=t_d)
    res = speculative_generate(target, ModelDrafter(draft), [1, 2, 3], 80, gamma=4, adaptive_gamma=b)
    assert res.tokens == generate(target, [1, 2, 3], 80).tokens
    later = b.choices[3:]  # after the warm-up, the measuring round and the plain one
    if want == "drafts":
        assert later.count(4) >= 0.8 * len(later) and 0 not in later
    else:
        assert later.count(0) >= 0.8 * len(later) and res.stats["plain_rounds"] == b.choices.count(0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_output_is_the_targets_with_measured_costs(seed):
    target = FakeModel(30, seed=seed)
    draft = FakeModel(30, seed=seed + 7, like=target, noise=0.4)
    ref = generate(target, [3, 4, 5], 60)
    res = speculative_generate(target, ModelDrafter(draft), [3, 4, 5], 60, gamma=4, adaptive_gamma="cost")
    assert res.tokens == ref.tokens and res.stats["adaptive_gamma"] == "cost"


def test_sampling_with_the_budget_follows_the_target_distribution():
    """Losslessness when g depends on the run so far: each seed's rounds choose by that seed's own acceptance
    (costs fixed so the outcome is reproducible: a cheap draft and dear verify rows make the choice flip between
    drafting and plain steps as acceptance moves; the budget's measuring rounds recorded before the run, so each of
    its few rounds chooses)."""
    from test_generation_distribution import ALPHA_SIG, DRAFT, L, N, PROMPT, TARGET, chi_square_pvalue, exact_joint

    cfg_kwargs = {"temperature": 1.0}
    samples, choices = [], set()
    for seed in range(N):
        b = FixedCosts(3, t_d=0.1, slope=0.15)
        for g in (3, 3, 0):  # the warm-up, the measuring round and the plain one
            b.choose([], [])
            b.record(g, g, 0.0, 0.0)
        b.choices.clear()
        res = spec.speculative_generate(TARGET, ModelDrafter(DRAFT), PROMPT, L, SamplingConfig(seed=seed, **cfg_kwargs),
                                        gamma=3, adaptive_gamma=b)
        samples.append(tuple(res.tokens))
        choices.add(tuple(b.choices))
    # the seeds took different paths of draft lengths, plain steps and two drafts among them (the prefill gives the
    # first of the L tokens, so a run has at most L - 1 rounds)
    assert len(choices) >= 3 and {0, 2} <= {g for path in choices for g in path}
    assert chi_square_pvalue(samples, exact_joint(SamplingConfig(**cfg_kwargs))) > ALPHA_SIG


def test_the_gate_keeps_a_draft_where_its_chance_pays_its_row():
    """The gated budget's gate (module docstring): before anything is measured, the CPU shares (a row 0.25 of a plain
    step, a draft step 0.1); then the measured line's slope and t_draft over t_1, worked by hand."""
    b = CostBudget(4, gated=True)
    assert b.include(1, 0.26) and not b.include(1, 0.24)
    assert b.extend(1, 0.36) and not b.extend(1, 0.34)
    assert b.choose([], []) == 4  # the warm-up: its seconds are not learnt
    b.record(2, 2, 0.5, 0.5, emitted=1)
    assert b.choose([], []) == 0  # then a plain step: t_1, the value of a token
    b.record(0, 0, 0.0, 0.050)
    assert b.choose([], []) == 4
    b.record(3, 3, 0.015, 0.089, emitted=4)  # 5 ms a draft step: after a plain round (a catch-up) ...
    assert b.t_draft == pytest.approx(0.005)  # ... but none was known yet, so it is learnt
    row = (0.089 - 0.050) / 3 / 0.050  # 0.26 of a step a row
    assert b.row_share() == pytest.approx(row) and b.draft_share() == pytest.approx(0.1)
    assert b.include(2, row + 0.01) and not b.include(2, row - 0.01)
    assert b.extend(2, row + 0.11) and not b.extend(2, row + 0.09)
    assert b.gain == pytest.approx(4 * 0.050 - 0.104)  # the round saved 96 ms over four plain steps


def test_gated_rounds_draft_while_they_save_and_go_plain_with_probes_when_not():
    """A round whose gate kept nothing still ran the drafter (a step, a plain verify): it saves less than nothing, so
    such rounds turn the run plain, and a probe that saves turns it back."""
    b = CostBudget(3, gated=True, probe_min=3, explore=0.05)
    b.choose([], []), b.record(0, 1, 0.005, 0.05)  # the warm-up
    b.choose([], []), b.record(0, 0, 0.0, 0.05)  # plain: t_1 = 50 ms
    seen = []
    for _ in range(60):
        g = b.choose([], [])
        seen.append(g)
        b.record(0, 1 if g else 0, 0.005 if g else 0.0, 0.05)  # the gate keeps nothing: 55 ms for one token
    assert seen[:GAIN_MIN] == [3] * GAIN_MIN and b.gain < 0 and seen[-10:].count(0) >= 7  # plain but for probes
    probes = [i for i, g in enumerate(seen) if g][GAIN_MIN:]
    assert probes and all(b - a > 3 for a, b in zip(probes, probes[1:]))
    while b.choose([], []) == 0:
        b.record(0, 0, 0.0, 0.05)
    b.record(3, 3, 0.015, 0.09, emitted=4)  # a probe that drafts three accepted ones: 200 ms of tokens in 105
    assert b.gain > 0 and b.choose([], []) == 3
    with pytest.raises(ValueError):
        CostBudget(3, gated=True, least=1)


def test_one_unlucky_first_round_does_not_send_the_run_plain():
    """GAIN_MIN drafting rounds are priced before a gated run may go plain, their plain mean first: a first drafting
    round that lost 20 ms, then two that saved 80 ms each, keep the run drafting (a running mean seeded by the first
    round alone went plain at once: a math prompt at 1.02x where drafting ran 1.54x)."""
    b = CostBudget(3, gated=True)
    b.choose([], []), b.record(3, 3, 0.015, 0.09, emitted=1)  # the warm-up
    b.choose([], []), b.record(0, 0, 0.0, 0.05)  # plain: t_1 = 50 ms
    assert b.choose([], []) == 3
    b.record(1, 1, 0.005, 0.065, emitted=1)  # lost 20 ms
    assert b.gain == pytest.approx(-0.02) and b.choose([], []) == 3  # one round is not enough to go plain
    b.record(3, 3, 0.015, 0.105, emitted=4)  # saved 80 ms
    assert b.gain == pytest.approx((-0.02 + 0.08) / 2) and b.choose([], []) == 3
    b.record(3, 3, 0.015, 0.105, emitted=4)
    assert b.gain == pytest.approx((-0.02 + 0.16) / 3) and b.choose([], []) == 3


def _gated_run(emitted, rounds=40):
    """A gated budget over drafting rounds of 105 ms that emit `emitted` (then 4 each) against 50 ms plain steps."""
    it = iter(emitted)
    return _drive(CostBudget(3, gated=True), (3, 3, 0.015, 0.09, 4), lambda i: (3, 3, 0.015, 0.09, next(it, 4)),
                  rounds)


def _drive(b, warm_up, drafting, rounds):
    """b through a warm-up round recorded as `warm_up` (drafted, forwards, draft s, verify s, emitted), a plain one
    (t_1 = 50 ms), then `rounds` rounds: a drafting one recorded as drafting(i), a plain one 50 ms. Returns each
    round's choice and b."""
    b.choose([], []), b.record(*warm_up)
    b.choose([], []), b.record(0, 0, 0.0, 0.05)
    seen = []
    for i in range(rounds):
        g = b.choose([], [])
        seen.append(g)
        if g:
            b.record(*drafting(i))
        else:
            b.record(0, 0, 0.0, 0.05)
    return seen, b


MATH_LIKE = [4, 4, 1, 1, 1, 1, 4, 4, 4, 1, 4, 4, 3, 4, 4, 1, 1, 1, 2, 4, 4]  # saves 27 ms a round on average


def test_a_paying_run_is_not_sent_plain_by_a_few_short_rounds(monkeypatch):
    """A round emits 1 to 4 tokens, so the running mean of the savings dips below zero after a few short rounds even
    where drafting pays (here +27 ms a round): the budget goes plain only when the mean is below zero by more than
    GAIN_Z standard errors. The bare sign (GAIN_Z 0, the rule before) sends this run plain for eight rounds."""
    from minitorch.generation import budget

    seen, b = _gated_run(MATH_LIKE)
    assert seen == [3] * len(seen) and b.gain > 0
    monkeypatch.setattr(budget, "GAIN_Z", 0.0)
    seen, _ = _gated_run(MATH_LIKE)
    assert seen[:6] == [3] * 6 and seen[6:14] == [0] * 8


def test_a_losing_run_with_noisy_rounds_still_goes_plain():
    """Rounds that mostly emit one token (a 55 ms loss each, now and then a 5 ms one): plain after the GAIN_MIN priced
    rounds, but for probes."""
    seen, b = _gated_run([1, 1, 2, 1, 1, 1, 2, 1, 1, 1, 1, 2, 1, 1, 1, 1, 2, 1] * 3, rounds=60)
    assert seen[:GAIN_MIN] == [3] * GAIN_MIN and seen[-20:].count(0) >= 15
    assert b.gain + b.gain_error() < 0


def _hopeless_run(rounds=140, pays_at=None):
    """A gated budget where the gate keeps nothing (55 ms a drafting round for one token against 50 ms plain steps),
    but in the first drafting round from `pays_at` on (if any), which drafts three accepted ones (105 ms for four
    tokens). Returns the rounds that ran the drafter after the first GAIN_MIN and the budget."""
    paid = []

    def drafting(i):
        if pays_at is not None and i >= pays_at and not paid:
            paid.append(i)
            return 3, 3, 0.015, 0.09, 4
        return 0, 1, 0.005, 0.05, 1

    b = CostBudget(3, gated=True, explore=1.0)  # exploring's share out of the way: the wait alone spaces the probes
    seen, b = _drive(b, (0, 1, 0.005, 0.05, 1), drafting, rounds)
    return [i for i, g in enumerate(seen) if g][GAIN_MIN:], b


def test_each_probe_that_costs_doubles_the_wait_for_the_next(monkeypatch):
    """Where nothing is accepted a probe comes after PROBE_MIN plain rounds, then 2, 4, 8 times as many (up to
    PROBE_MAX); a probe that pays turns the run back to drafting, and the wait starts again at PROBE_MIN. Without the
    doubling (the rule before) a probe comes every PROBE_MIN + 1 rounds."""
    from minitorch.generation import budget

    probes, b = _hopeless_run()
    gaps = [b2 - a for a, b2 in zip(probes, probes[1:])]
    assert gaps == [2 * PROBE_MIN + 1, 4 * PROBE_MIN + 1, PROBE_MAX + 1][:len(gaps)] and len(gaps) == 3
    assert b.probe_wait == PROBE_MAX
    _, b = _hopeless_run(rounds=62, pays_at=40)  # the probe at round 61 (after 3 + 9, 12 + 17, 29 + 33) pays
    assert b.probe_wait == PROBE_MIN and b.gain > 0 and b.choose([], []) == 3
    monkeypatch.setattr(budget, "PROBE_MAX", PROBE_MIN)  # the wait never grows: the rule before
    probes, _ = _hopeless_run()
    assert {b2 - a for a, b2 in zip(probes, probes[1:])} == {PROBE_MIN + 1} and len(probes) > 10
