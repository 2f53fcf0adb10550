"""Same-run A/B on the CPU: speculative decoding with the draft's weights as the GGUF stores them ("spec8")
and requantized to 4-bit codes ("spec4", load_model(requantize=4), the CLI's default), and target alone.

    python tools/ab_draft_quant.py [N_PROMPTS=3] [NEW_TOKENS=128] [float32|int8]

First N GSM8K test questions with the chat prompt, greedy, gamma 4; tokens/s include each prefill. Prints
whether each speculative text equals the target-alone text, the acceptance rates, and the draft alone."""
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT); sys.path.insert(0, os.path.join(ROOT, "project"))
from minitorch.models import load_model
from minitorch.generation import generate, speculative_generate
from minitorch.cpu.packed import set_activations
from evaluation.data import build_prompt
N = int(sys.argv[1]) if len(sys.argv) > 1 else 3
NEW = int(sys.argv[2]) if len(sys.argv) > 2 else 128
if len(sys.argv) > 3: set_activations(sys.argv[3])
tgt, tok = load_model("qwen2.5-coder-1.5b-instruct", progress=False)
d8, _ = load_model("qwen2.5-coder-0.5b-instruct", progress=False)
d4, _ = load_model("qwen2.5-coder-0.5b-instruct", progress=False, requantize=4)
qs = [json.loads(l)["question"] for l in open(os.path.join(ROOT, "data", "gsm8k", "test.jsonl"))][:N]
V = min(tgt.config.vocab_size, tok.vocab_size)
stops = set(tok.stop_token_ids)
warm = tok.encode(build_prompt(tok, qs[0]))
for m in (tgt, d8, d4): generate(m, warm, 3, vocab_size=V)
for d in (d8, d4): speculative_generate(tgt, d, warm, 12, gamma=4, vocab_size=V)
agg = {k: [0, 0.0] for k in ("target", "spec8", "spec4", "draft8", "draft4")}
al = {"spec8": [], "spec4": []}
for q in qs:
    ids = tok.encode(build_prompt(tok, q))
    runs = {}
    for k, fn in (("target", lambda: generate(tgt, ids, NEW, stop_ids=stops, vocab_size=V)),
                  ("spec8", lambda: speculative_generate(tgt, d8, ids, NEW, stop_ids=stops, gamma=4, vocab_size=V)),
                  ("spec4", lambda: speculative_generate(tgt, d4, ids, NEW, stop_ids=stops, gamma=4, vocab_size=V)),
                  ("draft8", lambda: generate(d8, ids, 32, vocab_size=V)),
                  ("draft4", lambda: generate(d4, ids, 32, vocab_size=V))):
        t = time.perf_counter(); r = fn(); dt = time.perf_counter() - t
        runs[k] = r
        agg[k][0] += len(r.tokens); agg[k][1] += dt
        if k.startswith("spec"): al[k].append(r.stats.get("alpha"))
    print("same text:", runs["spec8"].tokens == runs["target"].tokens, runs["spec4"].tokens == runs["target"].tokens,
          "alpha", al["spec8"][-1], al["spec4"][-1], flush=True)
for k, (n, s) in agg.items(): print(f"{k:7s} {n / s:6.2f} tok/s (incl. prefill)  {n} tokens {s:.1f} s")
print("load", os.getloadavg())
