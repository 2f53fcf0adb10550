import sys, time, argparse
import numpy as np
import minitorch
from minitorch.generation.head_drafter import HeadDrafter
from project.cli_common import load_models
from project.evaluation.runner import read_results
from project.settings import add_engine_args, resolve_settings
rows = read_results("docs/results/cpu_zen4_specbench_10_stage5_head/sb10_r2.jsonl.gz")
prompts = {r["id"]: r["prompt"] for r in rows if r["mode"] == "target"}
p = argparse.ArgumentParser(); add_engine_args(p)
m = load_models(resolve_settings(p.parse_args([])), progress=False)
t = m.target
ids = m.tokenizer.encode(prompts[sys.argv[1]])
print(len(ids), "tokens")
res = {}
with minitorch.no_grad():
    for rep in range(4):
        c = t.new_cache(len(ids) + 128); t0 = time.perf_counter(); t(ids, c, last_n=1); a = time.perf_counter() - t0
        c = t.new_cache(len(ids) + 128); t0 = time.perf_counter(); lg, feats = t(ids, c, last_n=1, return_hidden=True); b = time.perf_counter() - t0
        d = HeadDrafter(m.head, t)
        t0 = time.perf_counter(); d.start(ids, len(ids) + 128, m.vocab_size); s = time.perf_counter() - t0
        t0 = time.perf_counter(); d.observe(feats); o = time.perf_counter() - t0
        if rep:
            for k, v in (("plain", a), ("hidden", b), ("start", s), ("observe", o)):
                res.setdefault(k, []).append(v)
        print(rep, f"plain {a:.2f} hidden {b:.2f} start {s:.3f} observe {o:.3f}", flush=True)
print({k: round(min(v), 3) for k, v in res.items()})
