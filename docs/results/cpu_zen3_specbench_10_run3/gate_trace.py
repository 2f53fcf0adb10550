"""The README's demo with the gated budget's decisions traced: for each drafting round its tokens, seconds and the
saving it was priced at, and where the budget went plain (its mean saving and standard error then)."""
import sys, json
from minitorch.generation import budget as B
log = []
_rec, _ch = B.CostBudget.record, B.CostBudget._choose_gated
def record(self, drafted, draft_forwards, draft_seconds, verify_seconds, emitted=1):
    _rec(self, drafted, draft_forwards, draft_seconds, verify_seconds, emitted)
    if self.gated:
        log.append(("r", self.rounds, drafted, emitted, round((draft_seconds + verify_seconds) * 1e3, 1),
                    round(self.t_verify.get(1, 0) * 1e3, 1), None if self.gain is None else round(self.gain * 1e3, 1),
                    round(self.gain_error() * 1e3, 1)))
def choose(self):
    g = _ch(self)
    if g == 0 and 1 in self.t_verify and self.rounds > 1:
        log.append(("plain", self.rounds))
    return g
B.CostBudget.record, B.CostBudget._choose_gated = record, choose
sys.argv = ["run_spec_decoding.py", "--json"] + sys.argv[1:]
import runpy, io, contextlib
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    try:
        runpy.run_path("project/run_spec_decoding.py", run_name="__main__")
    except SystemExit:
        pass
d = json.loads(buf.getvalue()[buf.getvalue().index("{"):])
st = d["spec"]["stats"]
print(f"speedup {d['speedup']:.3f} tau {st['tau']:.2f} plain {st.get('plain_rounds')} closed {st.get('gate_closed_rounds')}")
# the spec run's rounds only: the last generation logged (the warm-up ran first)
starts = [i for i, e in enumerate(log) if e[0] == "r" and e[1] == 1]
for e in log[starts[-2] if len(starts) > 1 else 0:] if False else log[starts[-1]:]:
    if e[0] == "plain" or (e[0] == "r" and e[2] > 0):
        print(e)
