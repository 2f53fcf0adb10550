"""The target's prefill with and without return_hidden, and the head drafter's start + observe, alternating (CLI
settings, int8), on a real Spec-Bench rag prompt (818 tokens)."""
import argparse, gzip, json, time
import numpy as np
from project.settings import add_engine_args, resolve_settings
from project.cli_common import load_models
from minitorch import no_grad
from minitorch.generation.head_drafter import HeadDrafter
p = argparse.ArgumentParser(); add_engine_args(p)
m = load_models(resolve_settings(p.parse_args(["--drafter", "head"])), progress=False)
tgt, head, tok = m.target, m.head, m.tokenizer
rec = [json.loads(l) for l in open("docs/results/cpu_zen3_head_kv_only/specbench_sum_rag_r3.jsonl (gunzipped)") if '"spec_bench-490"' in l][0]
prompt = tok.encode(rec["prompt"]) if isinstance(rec["prompt"], str) else rec["prompt"]
print("prompt tokens", len(prompt))
res = {"plain": [], "hidden": [], "start+observe": []}
with no_grad():
    for rep in range(4):
        c = tgt.new_cache(len(prompt) + 200); t0 = time.perf_counter(); tgt(prompt, c, last_n=1); res["plain"].append(time.perf_counter() - t0)
        c = tgt.new_cache(len(prompt) + 200); t0 = time.perf_counter(); lg, feats = tgt(prompt, c, last_n=1, return_hidden=True); res["hidden"].append(time.perf_counter() - t0)
        d = HeadDrafter(head, tgt); t0 = time.perf_counter(); d.start(prompt, len(prompt) + 200, m.vocab_size); d.observe(feats); res["start+observe"].append(time.perf_counter() - t0)
for k, v in res.items():
    print(k, " ".join(f"{x:.3f}" for x in v), "min", f"{min(v):.3f}")
