"""Statistics of one generation: counts, acceptance, timing, and Leviathan's predicted speedup.

Definitions (returned in `GenerationResult.stats`):
- drafted: draft tokens proposed; accepted: draft tokens accepted and emitted.
- alpha = accepted / drafted (the acceptance rate; drafts after a rejection count as drafted).
- token_acceptance = accepted / judged: per-token acceptance probability, where a draft token is
  "judged" when every token before it was accepted (Leviathan's alpha; used for the prediction).
- tau = new tokens / target forwards in the decode loop (mean tokens per verification; a token the prefill gave, the
  first one on the CPU engine, is not in it).
- per_position_acceptance[i] = accepted / judged at draft position i.
- accept_length_hist[n] = number of verification rounds that accepted exactly n draft tokens.
- predicted_speedup = E[tokens per round] / (gamma * c + 1) with E = (1 - a^(gamma+1)) / (1 - a),
  a = token_acceptance and c = (time per draft forward) / (time per target forward), both measured.
  Leviathan's model prices a (gamma+1)-token verify forward like a 1-token step; where it is not
  (a CPU verify pass costs ~1.6x a step), `cost_model_speedup` puts the measured step times in:
  E * t_step / (f * t_draft + t_verify), f = draft forwards a round (gamma for a model drafter, fewer
  when prompt lookup continues its drafts, 0 for the n-gram drafter), E = 1 + sum_i prod_{j<=i} a_j
  from the per-position acceptance a_j (positions judged after different drafters, e.g. a model's then
  looked-up tokens, accept at different rates; the geometric E above assumes one rate), comparable with
  the measured speedup.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


def expected_tokens_per_round(alpha: float, gamma: float) -> float:
    """Leviathan et al. (2023) eq. 1: expected tokens per verification, (1 - a^(g+1)) / (1 - a)."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1.0)) / (1.0 - alpha)


def predicted_speedup(alpha: float, gamma: float, c: float) -> float:
    """Leviathan et al. (2023) Theorem 3.8: walltime improvement (1 - a^(g+1)) / ((1 - a)(g c + 1))."""
    return expected_tokens_per_round(alpha, gamma) / (gamma * c + 1.0)


def forward_times(spec: dict[str, Any], target: dict[str, Any]) -> tuple[float, float, float]:
    """(t_draft, t_verify, t_step) in seconds per forward, from the timers and forward counts of a
    speculative run's stats and an autoregressive run's stats (0.0 where nothing was measured)."""
    def per(st: dict[str, Any], seconds: str, count: str) -> float:
        return st.get(seconds, 0.0) / st[count] if st.get(count) else 0.0

    return (per(spec, "time_draft", "draft_forwards"), per(spec, "time_verify", "target_forwards"),
            per(target, "time_verify", "target_forwards"))


def expected_tokens_by_position(rates: list[float]) -> float:
    """E[tokens per round] when draft position i is accepted with probability rates[i] given that the ones
    before it were: 1 + sum_i prod_{j<=i} rates[j] (the correction or bonus token counts 1)."""
    total, run = 1.0, 1.0
    for a in rates:
        run *= a
        total += run
    return total


def cost_model_speedup(spec: dict[str, Any], target: dict[str, Any]) -> float | None:
    """Expected speedup with every cost measured: E * t_step / (f * t_draft + t_verify), t_step = a
    target-alone decode forward (from `target`, an autoregressive run's stats), t_draft and t_verify = a
    draft forward and a verify forward of the speculative run `spec` (forward_times), f = its draft forwards
    a round, E from its per-position acceptance (expected_tokens_by_position; without those, Leviathan's E
    from token_acceptance and mean_gamma). None if unmeasured or `spec` has no acceptance statistics."""
    t_draft, t_verify, t_step = forward_times(spec, target)
    rounds = spec.get("rounds")
    if t_step <= 0 or t_verify <= 0 or not rounds or "token_acceptance" not in spec:
        return None
    rates = spec.get("per_position_acceptance")
    E = (expected_tokens_by_position(rates) if rates else
         expected_tokens_per_round(spec["token_acceptance"], spec.get("mean_gamma") or 0.0))
    per_round = spec.get("draft_forwards", 0) / rounds
    return E * t_step / (per_round * t_draft + t_verify)


class Timer:
    """Accumulates seconds per named phase: `with timer("draft"): ...`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._name = ""
        self._t0 = 0.0

    def __call__(self, name: str) -> "Timer":
        self._name = name
        return self

    def __enter__(self) -> "Timer":
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.add(self._name, time.perf_counter() - self._t0)

    def add(self, name: str, seconds: float) -> None:
        """Count seconds measured elsewhere (e.g. GPU events) towards a phase."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def get(self, name: str) -> float:
        return self.seconds.get(name, 0.0)


@dataclass
class SpecStats:
    """Running counters of a speculative generation; `as_dict` derives the rates."""

    new_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    target_tokens: int = 0  # tokens produced by the target itself (corrections, bonus, plain steps)
    target_forwards: int = 0  # verification forwards (prefill not counted)
    prefill_tokens: int = 0  # tokens the prefill gave (its last row: the first token), in new_tokens but in no round
    draft_forwards: int = 0
    rounds: int = 0
    gamma_sum: int = 0  # sum of draft lengths actually proposed, for the mean gamma
    position_judged: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    accept_length_hist: list[int] = field(default_factory=list)
    timer: Timer = field(default_factory=Timer)

    def costs(self) -> tuple[int, float, float]:
        """(draft forwards, draft seconds, verify seconds) so far: a round's costs are the growth of these."""
        return self.draft_forwards, self.timer.get("draft"), self.timer.get("verify")

    def costs_since(self, before: tuple[int, float, float]) -> tuple[int, float, float]:
        return tuple(now - then for now, then in zip(self.costs(), before))  # type: ignore[return-value]

    def record_round(self, n_drafted: int, n_accepted_judged: int, n_emitted_drafts: int,
                     n_emitted_target: int) -> None:
        """One verification: n_drafted proposed, n_accepted_judged passed the rule, and of the emitted
        tokens n_emitted_drafts came from the draft and n_emitted_target from the target."""
        self.rounds += 1
        self.target_forwards += 1
        self.drafted += n_drafted
        self.gamma_sum += n_drafted
        self.accepted += n_emitted_drafts
        self.target_tokens += n_emitted_target
        self.new_tokens += n_emitted_drafts + n_emitted_target
        n_judged = min(n_drafted, n_accepted_judged + 1)
        while len(self.position_judged) < n_drafted:
            self.position_judged.append(0)
            self.position_accepted.append(0)
        for i in range(n_judged):
            self.position_judged[i] += 1
            if i < n_accepted_judged:
                self.position_accepted[i] += 1
        while len(self.accept_length_hist) <= n_accepted_judged:
            self.accept_length_hist.append(0)
        self.accept_length_hist[n_accepted_judged] += 1

    def as_dict(self, total_seconds: float) -> dict[str, Any]:
        """Counters plus derived rates (see the module docstring for the definitions)."""
        t = self.timer
        judged = sum(self.position_judged)
        alpha = self.accepted / self.drafted if self.drafted else 0.0
        token_acc = sum(self.position_accepted) / judged if judged else 0.0
        mean_gamma = self.gamma_sum / self.rounds if self.rounds else 0.0
        t_draft_fwd = t.get("draft") / self.draft_forwards if self.draft_forwards else 0.0
        t_target_fwd = t.get("verify") / self.target_forwards if self.target_forwards else 0.0
        c = t_draft_fwd / t_target_fwd if t_target_fwd > 0 else 0.0
        return {
            "new_tokens": self.new_tokens,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "target_tokens": self.target_tokens,
            "alpha": alpha,
            "token_acceptance": token_acc,
            "tau": (self.new_tokens - self.prefill_tokens) / self.target_forwards if self.target_forwards else 0.0,
            "target_forwards": self.target_forwards,
            "prefill_tokens": self.prefill_tokens,
            "draft_forwards": self.draft_forwards,
            "rounds": self.rounds,
            "mean_gamma": mean_gamma,
            "per_position_acceptance": [
                a / j if j else 0.0 for a, j in zip(self.position_accepted, self.position_judged)
            ],
            "per_position_judged": list(self.position_judged),
            "accept_length_hist": list(self.accept_length_hist),
            "time_prefill": t.get("prefill"),
            "time_draft": t.get("draft"),
            "time_verify": t.get("verify"),
            "time_sample": t.get("sample"),
            "time_total": total_seconds,
            "tokens_per_s": self.new_tokens / total_seconds if total_seconds > 0 else 0.0,
            "cost_ratio_c": c,
            "predicted_speedup": predicted_speedup(token_acc, mean_gamma, c) if self.rounds else 1.0,
        }


@dataclass
class GenerationResult:
    """What every generation returns: new tokens only, why it stopped, and its statistics."""

    tokens: list[int]
    stop_reason: str  # "stop" (a stop token was emitted, and is the last token) | "length"
    stats: dict[str, Any]
