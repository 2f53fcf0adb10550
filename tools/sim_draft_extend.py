"""Simulated greedy speculative decoding with the draft's drafts continued by prompt lookup (--draft-extend),
from a benchmark's own target outputs: no GPU needed.

    PYTHONPATH=. python tools/sim_draft_extend.py docs/results/2026-12-01_h200_round10/gsm8k_new.jsonl

The draft model runs once per problem on the CPU over prompt + the target's output (teacher forcing); its
argmax at each position is its greedy draft there. That is exact for accepted lengths: a chain of drafts is
judged in order and stops at its first miss, and up to that miss the draft saw exactly the target's tokens.
Each round then costs what round 10 measured on the H200 (a draft one-token step, the draft's longer first
step after a full acceptance, a verify of g drafts as a multiple of a target step); the ratio printed is
target-alone time over speculative time. With those costs plain gamma 4 comes out at 1.456x / tau 4.38 for
round 10's GSM8K run, which measured 1.44x / tau 4.38. A round whose model drafts missed is charged the full
extension's verify rows (its looked-up tokens are unknown here): an upper bound on the cost.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from minitorch.generation import NGramDrafter, SamplingConfig  # noqa: E402

STEP = 1.40  # ms, the 1.5B target's step (tc)
C1 = 0.618  # ms, the 0.5B draft's one-token step on 8-bit rows (the demo's real-run figure)
CT = {T: 0.596 * r for T, r in {2: 1.26, 3: 1.33, 4: 1.41, 5: 1.48, 6: 1.55, 7: 1.62, 8: 1.68}.items()}  # T tokens
VER = {1: 1.05, 2: 1.09, 3: 1.13, 4: 1.17, 5: 1.21, 6: 1.25, 7: 1.30, 8: 1.44}  # verify of g drafts / a step


def predictions(path: Path, draft: str) -> list[tuple[list[int], list[int], list[int]]]:
    """(prompt ids, output ids, the draft's teacher-forced greedy prediction of each output token)."""
    import minitorch
    from minitorch import FastBackend
    from minitorch.models import load_model

    rows = [json.loads(line) for line in path.open()]
    rows = [r for r in rows if r["mode"] == "target"]
    model, tok = load_model(draft, backend=FastBackend, dtype="float32", progress=False)
    out = []
    with minitorch.no_grad():
        for r in rows:
            p, g = tok.encode(r["prompt"]), tok.encode(r["text"])
            logits = model(p + g, None).to_numpy()[0]
            out.append((p, g, logits[len(p) - 1:len(p) - 1 + len(g)].argmax(-1).tolist()))
    return out


def simulate(data, gamma: int, extend: int) -> tuple[float, float]:
    """(speedup over the target alone, tokens a round)."""
    lookup, cfg, rng = NGramDrafter(), SamplingConfig(), np.random.default_rng(0)
    tokens = ms = rounds = 0.0
    for p, g, pred in data:
        k, first_T, N = 0, 1, len(g)
        while k < N:
            rounds += 1
            a = 0
            while a < gamma and k + a < N and pred[k + a] == g[k + a]:
                a += 1
            cost = (CT[min(first_T, 8)] if first_T > 1 else C1) + C1 * (gamma - 1)
            rows, e = gamma, 0
            if extend:
                if a == gamma:
                    cont, _ = lookup.propose([*p, *g[:k + gamma]], extend, cfg, rng)
                    while e < len(cont) and k + gamma + e < N and cont[e] == g[k + gamma + e]:
                        e += 1
                    rows += len(cont)
                else:
                    rows += extend
            cost += STEP * (VER[rows] if rows <= 8 else 1.44 + 0.1 * (rows - 8))
            new = min(a + e + 1, N - k)
            tokens += new
            ms += cost
            first_T = 2 + e if a == gamma else 1
            k += new
    return tokens * STEP / ms, tokens / rounds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path, help="a benchmark's results .jsonl (its target-alone texts)")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--gammas", default="3,4,5")
    ap.add_argument("--extends", default="0,2,3,4")
    args = ap.parse_args()
    data = predictions(args.results, args.draft)
    agree = np.mean([np.mean(np.array(pr) == np.array(g)) for _, g, pr in data])
    print(f"{len(data)} problems, {sum(len(g) for _, g, _ in data)} tokens; draft greedy agreement {agree:.3f}")
    for gamma in map(int, args.gammas.split(",")):
        for x in map(int, args.extends.split(",")):
            sp, tau = simulate(data, gamma, x)
            print(f"gamma {gamma} + lookup {x}: predicted speedup {sp:.3f}x, tau {tau:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
