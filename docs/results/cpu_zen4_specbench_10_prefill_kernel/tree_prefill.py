# the prompts come from stop 68's records; run from the repository root: python docs/results/cpu_zen4_specbench_10_prefill_kernel/tree_prefill.py 490
import sys, time, argparse
import numpy as np
import minitorch
from project.cli_common import load_models
from project.evaluation.runner import read_results
from project.settings import add_engine_args, resolve_settings
rows = read_results("docs/results/cpu_zen4_specbench_10_stage5_head/sb10_r2.jsonl.gz")
prompts = {r["id"]: r["prompt"] for r in rows if r["mode"] == "target"}
p = argparse.ArgumentParser(); add_engine_args(p)
m = load_models(resolve_settings(p.parse_args([])), progress=False)
print(minitorch.__file__)
alone = m.engine().alone()
for q in sys.argv[1].split(","):
    ids = m.tokenizer.encode(prompts["spec_bench-" + q])
    ts = []
    for rep in range(3):
        r = alone.generate(ids, max_new_tokens=2)
        ts.append(r.stats["time_prefill"])
    print(q, len(ids), "prefill s", [round(t, 2) for t in ts], f"{len(ids) / min(ts):.1f} tok/s", flush=True)
