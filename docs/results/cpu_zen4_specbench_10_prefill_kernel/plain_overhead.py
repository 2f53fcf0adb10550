"""Decode seconds per target forward: the target alone, speculative with the head (the CLI's CPU defaults), and
speculative with every round after the warm-up forced plain (the engine's per-round overhead alone), alternating."""
import sys, time
import numpy as np
import argparse
from minitorch.generation import budget as B
from project.cli_common import load_models
from project.evaluation.runner import read_results
from project.settings import add_engine_args, resolve_settings

ids = sys.argv[1].split(",")
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
rows = read_results("docs/results/cpu_zen4_specbench_10_stage5_head/sb10_r2.jsonl.gz")
prompts = {r["id"]: r["prompt"] for r in rows if r["mode"] == "target"}
p = argparse.ArgumentParser(); add_engine_args(p)
m = load_models(resolve_settings(p.parse_args([])), progress=False)
eng = m.engine(); alone = eng.alone()
orig = B.CostBudget._choose_gated
def plain(self):
    g = orig(self)
    return g if self.rounds == 0 else 0
res = {}
alone.generate(m.tokenizer.encode(prompts["spec_bench-" + ids[0]]), max_new_tokens=16)  # warm (ids: 490,244)
for q in ids:
    toks = m.tokenizer.encode(prompts["spec_bench-" + q])
    for rep in range(reps):
        order = [("alone", alone), ("spec", eng), ("plain", eng)]
        if rep % 2: order = order[::-1]
        for name, e in order:
            B.CostBudget._choose_gated = plain if name == "plain" else orig
            r = e.generate(toks, max_new_tokens=128)
            s = r.stats
            dec = s["time_total"] - s["time_prefill"]
            res.setdefault((q, name), []).append((dec, s.get("target_forwards"), len(r.tokens), s["time_prefill"]))
    B.CostBudget._choose_gated = orig
    base = np.array([d for d, *_ in res[(q, "alone")]])
    line = []
    for name in ("alone", "spec", "plain"):
        d = np.array([x[0] for x in res[(q, name)]])
        f = res[(q, name)][0][1]; n = res[(q, name)][0][2]
        line.append(f"{name} decode {np.median(d):.2f}s fwd {f} tok {n} ({1e3*np.median(d)/max(f,1):.1f} ms/fwd) paired x{np.median(base/d):.3f}")
    print(q, " | ".join(line), flush=True)
    for name in ("alone", "spec", "plain"):
        print("   prefill", name, [round(x[3], 2) for x in res[(q, name)]], flush=True)
