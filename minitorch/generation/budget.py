"""How much to draft each round, from what the run has measured: speculation that is never much slower than the
target alone.

A round that drafts g tokens costs g draft steps and one verify of g + 1 rows, and emits on average

    E[tokens | g] = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_g

where a_i is the acceptance rate of draft position i given that every earlier one was accepted (SpecStats'
per-position counts: position i is judged only then). `CostBudget.choose` takes the g in 0..gamma with the most
expected tokens a second,

    E[tokens | g] / (g * t_draft + t_verify(g + 1)),

with g = 0 a plain target step (one token for t_verify(1)). t_draft is the measured seconds of a draft step and
t_verify(r) of a verify over r rows (running means a row count, linear between the row counts measured: a verify
row costs little on a GPU, more on a CPU). A draft position judged rarely takes its rate from the position before
it (shrunk towards it with the weight of PRIOR judgements), so when the first draft's acceptance climbs the
later ones follow and get tried, instead of staying at what one early round saw.

The first round is a warm-up: it drafts gamma and its acceptance counts, but not its seconds (right after the prefill
a round runs cold: on a 2-core Zen 3 its 4-row verify took 118 ms where a warm one takes about 88, and one such figure
sent every later round plain). The second drafts gamma too, the third none (or `least`, the fewest a round may
draft), so both ends of the verify line are measured warm. Where drafting does not pay the run goes plain, and
drafts once more ("a probe") only while what exploring has cost so far (the first round's and the probes' seconds
beyond what plain steps would have taken for the tokens they gave) stays within EXPLORE of the run's time: a drafter
that must catch up on the tokens it skipped (a draft model) probes seldom, a cheap one (a head, prompt lookup) often.
A probe waits PROBE_MIN plain rounds after the last drafting round, twice as many after a probe that cost more than
plain steps (up to PROBE_MAX), PROBE_MIN again after one that paid: where nothing is accepted (spec_bench-321, a
24-token answer the head cannot guess, on a 2-core Zen 4) its two probes cost about 2.6% of its 1.0 s decode; with
the doubling the second does not come. A draft step's cost is learnt from rounds that follow a drafting round, so a
probe's catch-up does not make every later draft look dear.

The choice depends only on rounds already finished, never on the tokens being drafted, so greedy output is the
target's and sampling keeps the target's distribution, whatever g each round takes.

A drafter that knows how sure it is (a head: its top probability, which tracks its acceptance closely: on 13
Spec-Bench questions, drafts at confidence 0.0-0.2 were accepted 12% of the time, at 0.4-0.6 49%, at 0.9-1 95%)
runs **gated** (`gated=True`): the budget decides only whether a round drafts at all, and the drafter asks the gate
before each draft. With p the product of the drafts' confidences so far (the chance all of them are accepted),

    include draft n   if p * t_1 >= the verify row it adds     (t_1: a plain step, the value of one token)
    draft one more    if p * t_1 >= a draft step + its row

with a row's and a step's seconds from the measured line t_verify(r) and t_draft (before they are measured, shares
of a plain step seen on a 2-core CPU: ROW_SHARE, DRAFT_SHARE). The confidence is the drafter's distribution's top
probability, known before the draft is drawn, so a draft that is kept is still a draw from q (lossless). Whether a
round drafts comes from what drafting rounds saved: each one's `emitted * t_1 - its seconds`, a running mean (the
plain mean of the first 1 / GAIN_EMA); once GAIN_MIN rounds are in it and while it is below zero by more than GAIN_Z
standard errors (its running spread over the rounds it weighs), the run goes plain and probes as above. Both guards
keep noise from sending a paying run plain: one unlucky first round sent a math prompt plain at gamma 5 (1.02x where
ungated ran 1.54x); and a round emits 1 to gamma + 1 tokens, so a mean over the ~9 rounds the running mean weighs dips
below zero now and then even where drafting pays (GSM8K first 20 on a 2-core Zen 3, acceptance 0.7-0.8: runs spent
up to 66% of their rounds plain and ran 1.07-1.17x where the two drafting throughout ran 1.47-1.48x). So a head that is
seldom sure costs one draft step a round until the mean turns, then nothing but the probes; one that is sure where it
is right drafts just there.
"""
from __future__ import annotations

from collections.abc import Sequence

EMA = 0.3  # weight of a new measurement in the running means
PRIOR = 2.0  # judgements' worth of the previous position's rate (the first position's: 0.5) in a position's rate
EXPLORE = 0.03  # share of the run's time that the first round and the probes may cost beyond plain steps
PROBE_MIN = 8  # plain rounds in a row before a probe
PROBE_MAX = 64  # the most plain rounds in a row before a probe, however many probes have cost (twice more each)
GAIN_EMA = 0.2  # weight of a drafting round's saving in the gated budget's running mean (a plain mean until then)
GAIN_MIN = 3  # drafting rounds priced before the gated budget may go plain (one unlucky round decided it before)
GAIN_Z = 1.0  # the gated budget goes plain when its mean saving is below zero by this many standard errors
ROW_SHARE = 0.25  # a verify row's seconds as a share of a plain step, until measured (2-core Zen 3: 13 ms of 48)
DRAFT_SHARE = 0.1  # a draft step's seconds as a share of a plain step, until measured (a head there: 5 ms of 48)


class CostBudget:
    """The draft length of each round (choose) from the measured acceptance and costs (record)."""

    def __init__(self, gamma: int, explore: float = EXPLORE, probe_min: int = PROBE_MIN, least: int = 0,
                 gated: bool = False) -> None:
        """least: the fewest drafts a round (0: plain target steps allowed; 1 on the CUDA-graph path, whose drafters
        keep their state only by drafting every round: a verify row costs little there, so a round of one draft is
        the cheap end of the line). gated: the drafter asks `include` / `extend` before each draft (module
        docstring); each round is then gamma or none."""
        if gamma < 1:
            raise ValueError(f"gamma must be >= 1, got {gamma}")
        if not 0 <= least <= gamma:
            raise ValueError(f"least must be in 0..gamma, got {least}")
        if gated and least:
            raise ValueError("a gated budget lets rounds go plain: least must be 0")
        self.gamma, self.explore, self.probe_min, self.least, self.gated = gamma, explore, probe_min, least, gated
        self.t_draft: float | None = None
        self.t_verify: dict[int, float] = {}  # rows -> running mean seconds
        self.rounds = 0
        self.plain_run = 0  # consecutive plain rounds before the next one
        self.elapsed = 0.0  # seconds of every round so far
        self.explored = 0.0  # seconds the first round and the probes took beyond plain steps for their tokens
        self.probe_cost: float | None = None  # what the last probe (or the first round) cost beyond plain steps
        self.probe_wait = probe_min  # plain rounds in a row before the next probe (doubled by each probe that cost)
        self.choices: list[int] = []
        self._probing = False
        self.gain: float | None = None  # gated: running mean of the seconds a drafting round saved over plain steps
        self.gain_var = 0.0  # gated: the running variance of those savings (the same weights)
        self.priced = 0  # gated: drafting rounds in that mean
        self._unpriced: list[tuple[int, float]] = []  # gated: (emitted, seconds) of drafting rounds before t_1 is known
        self._ran = False  # the last round ran the drafter

    def rates(self, g: int, accepted: Sequence[int], judged: Sequence[int]) -> list[float]:
        """a_1..a_g: a position's counts shrunk towards the rate of the position before it (PRIOR judgements)."""
        out, prev = [], 0.5
        for i in range(g):
            a, j = (accepted[i], judged[i]) if i < len(judged) else (0, 0)
            prev = (a + PRIOR * prev) / (j + PRIOR)
            out.append(prev)
        return out

    def expected_tokens(self, g: int, accepted: Sequence[int], judged: Sequence[int]) -> float:
        """1 + a_1 + a_1 a_2 + ... + a_1 ... a_g."""
        total, run = 1.0, 1.0
        for rate in self.rates(g, accepted, judged):
            run *= rate
            total += run
        return total

    def verify_seconds(self, rows: int) -> float:
        """t_verify(rows): the running mean where measured, else linear between the nearest measured row counts
        (flat beyond them)."""
        if rows in self.t_verify:
            return self.t_verify[rows]
        known = sorted(self.t_verify)
        lo = max((r for r in known if r < rows), default=None)
        hi = min((r for r in known if r > rows), default=None)
        if lo is None or hi is None:
            return self.t_verify[lo if hi is None else hi]
        w = (rows - lo) / (hi - lo)
        return (1 - w) * self.t_verify[lo] + w * self.t_verify[hi]

    def choose(self, accepted: Sequence[int], judged: Sequence[int]) -> int:
        """This round's draft length: gamma until a draft step's cost is measured (the warm-up round and the next),
        then none (or `least`: both ends of the verify line measured), then the best expected tokens a second; a
        probe of one draft after probe_wait plain rounds while exploring stays within its share of the time."""
        self._probing = False
        if self.gated:
            g = self._choose_gated()
        elif self.rounds == 0 or self.t_draft is None:
            g, self._probing = self.gamma, self.rounds == 0
        elif self.least + 1 not in self.t_verify:
            g = self.least
        else:
            def rate(n: int) -> float:
                return self.expected_tokens(n, accepted, judged) / (n * self.t_draft + self.verify_seconds(n + 1))

            g = max(range(self.least, self.gamma + 1), key=rate)
            if g == 0 and self.plain_run >= self.probe_wait and \
                    self.explored + (self.probe_cost or 0.0) <= self.explore * self.elapsed:
                g, self._probing = 1, True
        self.choices.append(g)
        return g

    def record(self, drafted: int, draft_forwards: int, draft_seconds: float, verify_seconds: float,
               emitted: int = 1) -> None:
        """One finished round: drafted tokens, the drafter's forwards and seconds, the verify's seconds, the tokens
        it emitted."""
        self.rounds += 1
        self.elapsed += draft_seconds + verify_seconds
        rows = drafted + 1
        ran = bool(draft_forwards or drafted)
        if self.rounds > 1:  # the first round is the warm-up: its acceptance counts, its seconds do not
            # a step's cost from a round after a drafting one (after plain rounds: a catch-up, not a step's cost)
            after_drafting = self._ran if self.gated else self.plain_run == 0
            if ran and (self.gated or drafted) and (self.t_draft is None or after_drafting):
                t = draft_seconds / (draft_forwards or drafted)  # a prompt lookup has no forwards
                self.t_draft = t if self.t_draft is None else (1 - EMA) * self.t_draft + EMA * t
            old = self.t_verify.get(rows)
            self.t_verify[rows] = verify_seconds if old is None else (1 - EMA) * old + EMA * verify_seconds
            if self.gated and ran:
                self._unpriced.append((emitted, draft_seconds + verify_seconds))
            if self.gated and 1 in self.t_verify:
                for n, secs in self._unpriced:
                    self.priced += 1
                    w = max(GAIN_EMA, 1.0 / self.priced)  # the mean of the first rounds, then a running mean
                    saved = n * self.t_verify[1] - secs
                    if self.gain is None:
                        self.gain = saved
                    else:  # the exponentially weighted mean and variance (a plain mean and variance at first)
                        d = saved - self.gain
                        self.gain += w * d
                        self.gain_var = (1 - w) * (self.gain_var + w * d * d)
                self._unpriced.clear()
        self._ran = ran
        if self._probing:
            plain = self.t_verify.get(1, verify_seconds / rows)
            self.probe_cost = max(draft_seconds + verify_seconds - emitted * plain, 0.0)
            self.explored += self.probe_cost
            if self.rounds > 1:  # a probe, not the warm-up: one that cost waits twice as long for the next
                self.probe_wait = min(2 * self.probe_wait, PROBE_MAX) if self.probe_cost > 0 else self.probe_min
        self.plain_run = 0 if (ran if self.gated else drafted) else self.plain_run + 1

    def _choose_gated(self) -> int:
        """gamma (the drafter's gate decides how many) or none: the warm-up drafts, the next round is plain (t_1), then
        draft while drafting rounds have saved time on the whole (or none is priced yet), else plain with probes."""
        if self.rounds == 0:
            self._probing = True
            return self.gamma
        if 1 not in self.t_verify:
            return 0
        if self.gain is None or self.priced < GAIN_MIN or self.gain + GAIN_Z * self.gain_error() > 0:
            return self.gamma
        if self.plain_run >= self.probe_wait and \
                self.explored + (self.probe_cost or 0.0) <= self.explore * self.elapsed:
            self._probing = True
            return self.gamma
        return 0

    def gain_error(self) -> float:
        """The standard error of the mean saving: the running variance over the rounds the mean weighs (priced ones
        while it is a plain mean, about (2 - GAIN_EMA) / GAIN_EMA once it runs)."""
        if not self.priced:
            return 0.0
        return (self.gain_var * max(GAIN_EMA / (2 - GAIN_EMA), 1.0 / self.priced)) ** 0.5

    def row_share(self) -> float:
        """A verify row's seconds over a plain step's: the slope of the measured line t_verify(r) from r = 1 to the
        most rows measured, over t_verify(1); ROW_SHARE until two row counts are measured."""
        most = max(self.t_verify, default=1)
        if 1 not in self.t_verify or most == 1:
            return ROW_SHARE
        return max(self.t_verify[most] - self.t_verify[1], 0.0) / (most - 1) / self.t_verify[1]

    def draft_share(self) -> float:
        """A draft step's seconds over a plain step's (DRAFT_SHARE until both are measured)."""
        if self.t_draft is None or 1 not in self.t_verify:
            return DRAFT_SHARE
        return self.t_draft / self.t_verify[1]

    def include(self, n: int, p: float) -> bool:
        """The gate: keep the n-th draft, which is accepted together with every one before it with probability
        about p, if that chance of a token pays the verify row it adds (p * t_1 >= the row's seconds)."""
        return p >= self.row_share()

    def extend(self, n: int, p: float) -> bool:
        """The gate: draft after the n-th (all n accepted with probability about p) if even a sure next draft would
        pay its draft step and its row."""
        return p >= self.draft_share() + self.row_share()
