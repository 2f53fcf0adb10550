import sys, statistics, numpy as np
sys.argv=[sys.argv[0]]
import importlib.util
src=open('tools/sim_gate.py').read().split('policies = ')[0]
g={}; exec(src, g)
B=g['B']; run=g['run']
class Margin(B.CostBudget):
    M=1.5
    def include(self, n, p): return p >= self.M*self.row_share()
    def extend(self, n, p): return p >= self.M*(self.draft_share()+self.row_share())
class Margin2(Margin): M=2.0
class Early(B.CostBudget):
    """stricter only until a drafting round is priced"""
    def include(self, n, p):
        return p >= (2.0 if self.priced < B.GAIN_MIN else 1.0)*self.row_share()
    def extend(self, n, p):
        return p >= (2.0 if self.priced < B.GAIN_MIN else 1.0)*(self.draft_share()+self.row_share())
pol={"current": lambda gm: B.CostBudget(gm, gated=True), "m1.5": lambda gm: Margin(gm, gated=True),
     "m2": lambda gm: Margin2(gm, gated=True), "early2": lambda gm: Early(gm, gated=True)}
for n in (8, 16, 128):
    print(f"n_tokens {n}")
    for q in (0.0, 0.1, 0.3, 0.6):
        line=f"  q {q:4.2f}"
        for name, mk in pol.items():
            sp=[run(mk, q, n_tokens=n, seed=s) for s in range(300)]
            line+=f" | {name} {statistics.mean(sp):.3f} p5 {np.percentile(sp,5):.3f}"
        print(line, flush=True)
