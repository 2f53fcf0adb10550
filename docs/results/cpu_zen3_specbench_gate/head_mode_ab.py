"""The A/B behind sitting 3: the head's packed weights in float32 and in int8 activation mode, alternating, three
rounds of four Spec-Bench questions (48 new tokens) each; prompt-read and draft-step milliseconds. Run from the
repository root: python docs/results/cpu_zen3_specbench_gate/head_mode_ab.py"""
import time, json, argparse
from minitorch.generation import head_drafter as hd
from minitorch.cpu import packed as fp
from minitorch.packed import PackedWeight
from project.cli_common import load_models, encode_prompt
from project.settings import add_engine_args, resolve_settings
p = argparse.ArgumentParser(); add_engine_args(p)
m = load_models(resolve_settings(p.parse_args(["--drafter", "head"])), progress=False)
qs = [json.loads(l) for l in open("data/spec_bench/question.jsonl")]
head = m.head
ws = [p.value for _, p in head.named_parameters() if isinstance(p.value, PackedWeight)]
for mod in (head.layer.self_attn, head.layer.mlp):
    if getattr(mod, "joined", None) is not None: ws.append(mod.joined[0])
print(len(ws), "packed weights in the head;", [w.activations for w in ws][:3])
log = []
orig = hd.HeadDrafter._step
def step(self, feats, ids):
    a = time.perf_counter(); r = orig(self, feats, ids); log.append((int(feats.shape[1]), 1000 * (time.perf_counter() - a))); return r
hd.HeadDrafter._step = step
eng = m.engine(); alone = eng.alone()
eng.warm_up(encode_prompt(m.tokenizer, "hi", True))
res = {}
for rep in range(3):
    for mode in ("float32", "int8"):
        fp.set_weight_activations(ws, mode)
        eng.generate(encode_prompt(m.tokenizer, "warm", True), 4)
        for qi in (240, 241, 0, 30):
            ids = encode_prompt(m.tokenizer, qs[qi]["turns"][0], True)
            log.clear(); t = time.perf_counter(); r = eng.generate(ids, 48); el = time.perf_counter() - t
            big = [ms for rows, ms in log if rows > 16]; small = [ms for rows, ms in log if rows <= 16]
            res.setdefault(mode, []).append((el, sum(big), sum(small) / max(len(small), 1), r.stats['tau'], r.tokens))
for mode, v in res.items():
    import numpy as np
    print(mode, "total s %.2f" % sum(x[0] for x in v), "prompt read ms (mean) %.1f" % np.mean([x[1] for x in v]), "step ms (mean) %.2f" % np.mean([x[2] for x in v]), "tau", [round(x[3], 2) for x in v[:4]])
print("same outputs:", all(a[4] == b[4] for a, b in zip(res["float32"], res["int8"])))
