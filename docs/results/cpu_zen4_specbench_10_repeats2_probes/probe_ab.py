"""Probe backoff A/B: the rule before (PROBE_MAX = PROBE_MIN: a probe every PROBE_MIN + 1 plain rounds) against the
doubling, and the target alone, alternating, on Spec-Bench questions where the head's drafts are seldom accepted."""
import argparse, sys, statistics as S
from project.settings import add_engine_args, resolve_settings
from project.cli_common import load_models
from project.evaluation.data import load_problems
from project.evaluation.runner import problem_prompt
from minitorch.generation import budget as B
p = argparse.ArgumentParser(); add_engine_args(p, 128)
m = load_models(resolve_settings(p.parse_args([])), progress=False)
want = sys.argv[1].split(",")
reps = int(sys.argv[2])
probs = {q.id: q for q in load_problems("spec_bench")}
spec = m.engine(); alone = spec.alone(); spec.warm_up()
new_max = B.PROBE_MAX
res = {}
for rep in range(reps):
    for qid in want:
        _, ids = problem_prompt(m.tokenizer, probs[qid], None)
        order = ("alone", "before", "doubling") if rep % 2 == 0 else ("doubling", "before", "alone")
        for name in order:
            B.PROBE_MAX = B.PROBE_MIN if name == "before" else new_max
            e = alone if name == "alone" else spec
            st = e.generate(ids, max_new_tokens=128).stats
            dec = st["time_total"] - st["time_prefill"]
            res.setdefault((qid, name), []).append((dec, st.get("draft_forwards", 0), st.get("time_draft", 0.0),
                                                    st["new_tokens"]))
            print(qid, name, "decode %.3f draft_fwd %s draft_s %.3f tokens %d" % (dec, *res[(qid, name)][-1][1:]),
                  flush=True)
print("question: decode s (min of runs) alone / before / doubling; before and doubling over alone; draft forwards")
for qid in want:
    a, b, d = (min(x[0] for x in res[(qid, n)]) for n in ("alone", "before", "doubling"))
    print("%s %.3f / %.3f / %.3f  speedup before %.3f doubling %.3f  draft fwd %s / %s" % (
        qid, a, b, d, a / b, a / d, [x[1] for x in res[(qid, "before")]], [x[1] for x in res[(qid, "doubling")]]))
