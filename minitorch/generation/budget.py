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
draft), so both ends of the verify line are measured warm. Where drafting does not pay the run goes plain, and drafts once more ("a probe") only while what exploring has cost so far (the
first round's and the probes' seconds beyond what plain steps would have taken for the tokens they gave) stays
within EXPLORE of the run's time: a drafter that must catch up on the tokens it skipped (a draft model) probes
seldom, a cheap one (a head, prompt lookup) often. A draft step's cost is learnt from rounds that follow a drafting
round, so a probe's catch-up does not make every later draft look dear.

The choice depends only on rounds already finished, never on the tokens being drafted, so greedy output is the
target's and sampling keeps the target's distribution, whatever g each round takes.
"""
from __future__ import annotations

from collections.abc import Sequence

EMA = 0.3  # weight of a new measurement in the running means
PRIOR = 2.0  # judgements' worth of the previous position's rate (the first position's: 0.5) in a position's rate
EXPLORE = 0.03  # share of the run's time that the first round and the probes may cost beyond plain steps
PROBE_MIN = 8  # plain rounds in a row before a probe


class CostBudget:
    """The draft length of each round (choose) from the measured acceptance and costs (record)."""

    def __init__(self, gamma: int, explore: float = EXPLORE, probe_min: int = PROBE_MIN, least: int = 0) -> None:
        """least: the fewest drafts a round (0: plain target steps allowed; 1 on the CUDA-graph path, whose drafters
        keep their state only by drafting every round: a verify row costs little there, so a round of one draft is
        the cheap end of the line)."""
        if gamma < 1:
            raise ValueError(f"gamma must be >= 1, got {gamma}")
        if not 0 <= least <= gamma:
            raise ValueError(f"least must be in 0..gamma, got {least}")
        self.gamma, self.explore, self.probe_min, self.least = gamma, explore, probe_min, least
        self.t_draft: float | None = None
        self.t_verify: dict[int, float] = {}  # rows -> running mean seconds
        self.rounds = 0
        self.plain_run = 0  # consecutive plain rounds before the next one
        self.elapsed = 0.0  # seconds of every round so far
        self.explored = 0.0  # seconds the first round and the probes took beyond plain steps for their tokens
        self.probe_cost: float | None = None  # what the last probe (or the first round) cost beyond plain steps
        self.choices: list[int] = []
        self._probing = False

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
        probe of one draft after PROBE_MIN plain rounds while exploring stays within its share of the time."""
        self._probing = False
        if self.rounds == 0 or self.t_draft is None:
            g, self._probing = self.gamma, self.rounds == 0
        elif self.least + 1 not in self.t_verify:
            g = self.least
        else:
            def rate(n: int) -> float:
                return self.expected_tokens(n, accepted, judged) / (n * self.t_draft + self.verify_seconds(n + 1))

            g = max(range(self.least, self.gamma + 1), key=rate)
            if g == 0 and self.plain_run >= self.probe_min and \
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
        if self.rounds > 1:  # the first round is the warm-up: its acceptance counts, its seconds do not
            if drafted and (self.t_draft is None or self.plain_run == 0):  # a prompt lookup has no forwards
                t = draft_seconds / (draft_forwards or drafted)  # (after plain rounds: a catch-up, not a step's cost)
                self.t_draft = t if self.t_draft is None else (1 - EMA) * self.t_draft + EMA * t
            old = self.t_verify.get(rows)
            self.t_verify[rows] = verify_seconds if old is None else (1 - EMA) * old + EMA * verify_seconds
        if self._probing:
            plain = self.t_verify.get(1, verify_seconds / rows)
            self.probe_cost = max(draft_seconds + verify_seconds - emitted * plain, 0.0)
            self.explored += self.probe_cost
        self.plain_run = 0 if drafted else self.plain_run + 1
