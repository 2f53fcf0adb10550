"""The prefill of the speculative engine (the target's prefill with its features, the head started and its K/V pass
over the prompt) against the target alone's, alternating, on Spec-Bench prompts: one new token each, so nothing but
the prefill runs."""
import argparse, sys, statistics as S
from project.settings import add_engine_args, resolve_settings
from project.cli_common import load_models
from project.evaluation.data import load_problems
from project.evaluation.runner import problem_prompt
p = argparse.ArgumentParser(); add_engine_args(p, 128)
m = load_models(resolve_settings(p.parse_args([])), progress=False)
want = sys.argv[1].split(","); reps = int(sys.argv[2])
probs = {q.id: q for q in load_problems("spec_bench")}
spec = m.engine(); alone = spec.alone(); spec.warm_up()
res = {}
for rep in range(reps):
    for qid in want:
        _, ids = problem_prompt(m.tokenizer, probs[qid], None)
        for name in (("alone", "spec") if rep % 2 == 0 else ("spec", "alone")):
            st = (alone if name == "alone" else spec).generate(ids, max_new_tokens=1).stats
            res.setdefault((qid, name), []).append(st["time_prefill"])
for qid in want:
    a, s = res[(qid, "alone")], res[(qid, "spec")]
    print("%s prompt %d tokens: alone min %.3f median %.3f | spec min %.3f median %.3f | spec/alone min %.3f median %.3f"
          % (qid, len(problem_prompt(m.tokenizer, probs[qid], None)[1]), min(a), S.median(a), min(s), S.median(s),
             min(s) / min(a), S.median(s) / S.median(a)))
    print("   alone", " ".join("%.3f" % x for x in a), "\n   spec ", " ".join("%.3f" % x for x in s))
