"""Offline: the gated CostBudget (minitorch/generation/budget.py) on synthetic rounds, the current policy against two
variants (a hysteresis on resuming drafting; EXPLORE halved). A round's draft confidences are calibrated draws (a
"sure" token, U(0.85, 1), with probability q, else Beta(1, 6)), each draft accepted with its confidence in turn;
seconds from the 2-core Zen 3 box: 48 ms a plain step, 12 ms a verify row, 4.5 ms a head step, 0.6 ms a caught-up
position, 3% noise. Speedup over plain steps of the decode alone (no prefill), 200 seeds a cell: mean (5th percentile,
lowest). docs/results/cpu_zen3_specbench_10/.

    PYTHONPATH=. python tools/sim_gate.py
"""
import numpy as np, statistics, sys
from minitorch.generation import budget as B

T1, ROW, STEP, CATCH = 0.048, 0.012, 0.0045, 0.0006

class Hyst(B.CostBudget):
    """once plain, drafting resumes only when the mean saving is above zero by GAIN_Z standard errors"""
    def _choose_gated(self):
        if self.rounds == 0:
            self._probing = True; return self.gamma
        if 1 not in self.t_verify: return 0
        plain_now = getattr(self, "_plain_state", False)
        if self.gain is None or self.priced < B.GAIN_MIN:
            return self.gamma
        z = B.GAIN_Z * self.gain_error()
        if (not plain_now and self.gain + z > 0) or (plain_now and self.gain - z > 0):
            self._plain_state = False
            return self.gamma
        self._plain_state = True
        if self.plain_run >= self.probe_min and self.explored + (self.probe_cost or 0.0) <= self.explore * self.elapsed:
            self._probing = True; return self.gamma
        return 0

def run(make, q, n_tokens=128, gamma=3, seed=0, noise=0.03):
    rng = np.random.default_rng(seed)
    b = make(gamma)
    total = 0.0; out = 0; since = 0
    def conf():
        return rng.uniform(0.85, 1.0) if rng.random() < q else rng.beta(1, 6)
    while out < n_tokens:
        g = b.choose([], [])
        if g == 0:
            vs = T1 * (1 + noise * rng.standard_normal()); ds = 0.0; fw = 0; drafted = 0; emitted = 1; since += 1
        else:
            fw = 1; ds = STEP + CATCH * since; since = 0; p = 1.0; cs = []
            for i in range(gamma):
                c = conf(); 
                if not b.include(i + 1, p * c): break
                p *= c; cs.append(c)
                if i + 1 < gamma:
                    if not b.extend(i + 1, p): break
                    fw += 1; ds += STEP
            acc = 0
            for c in cs:
                if rng.random() < c: acc += 1
                else: break
            drafted, emitted = len(cs), acc + 1
            vs = (T1 + ROW * drafted) * (1 + noise * rng.standard_normal())
            since = emitted
        b.record(drafted, fw, ds, vs, emitted)
        total += ds + vs; out += emitted
    return out * T1 / total

policies = {"current": lambda g: B.CostBudget(g, gated=True),
            "hyst": lambda g: Hyst(g, gated=True),
            "explore1.5": lambda g: B.CostBudget(g, gated=True, explore=0.015)}
print("q (share of sure tokens) | " + " | ".join(policies))
for q in (0.0, 0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.75):
    line = f"{q:4.2f}"
    for name, mk in policies.items():
        sp = [run(mk, q, seed=s) for s in range(200)]
        line += f" | {statistics.mean(sp):.3f} (p5 {np.percentile(sp, 5):.3f}, min {min(sp):.3f})"
    print(line, flush=True)
