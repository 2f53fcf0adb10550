"""A draft head's drafting step on the CPU, in one process, alternating: the float32 head through the model's op-by-op
path against its packed() copy through the one-call forward (DraftHead.draft_step), on the real 1.5B target.

    python tools/cpu_head_step.py [--head DIR] [--rounds 10]

Prints the first step (the prompt's positions) and each later draft step in ms, and the drafts of both (the same
unless two tokens are nearly tied).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import minitorch
from minitorch.generation import SamplingConfig
from minitorch.generation.head_drafter import HeadDrafter
from minitorch.models import cache_root, load_model
from minitorch.models.draft_head import target_fingerprint
from minitorch.models.head_io import load_head

PROMPT = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
          "How many clips did Natalia sell altogether?")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--head", default=None, help="the head's folder (default: the cache's head for the target)")
    p.add_argument("--rounds", type=int, default=10)
    args = p.parse_args()
    m, tok = load_model("qwen2.5-coder-1.5b-instruct", progress=False)
    fl = load_head(args.head or cache_root() / "heads" / target_fingerprint(m), m)
    heads = {"float32": fl, "packed": fl.packed()}
    prompt = tok.encode(PROMPT)
    with minitorch.no_grad():
        lg, hid = m(prompt, m.new_cache(400), return_hidden=True)
    ctx = prompt + [int(lg.to_numpy()[0, -1].argmax())]
    res: dict[tuple[str, int], list[float]] = {}
    drafts: dict[str, list[int]] = {}
    for rnd in range(args.rounds + 2):
        for g in (1, 5):
            for name in (("float32", "packed") if rnd % 2 else ("packed", "float32")):
                d = HeadDrafter(heads[name], m)
                d.start(prompt, 400)
                d.observe(hid)
                t = time.perf_counter()
                with minitorch.no_grad():
                    out = d.propose(ctx, g, SamplingConfig(), np.random.default_rng(0))[0]
                if rnd >= 2:
                    res.setdefault((name, g), []).append(time.perf_counter() - t)
                drafts[name] = out
    for name in heads:
        g1, g5 = float(np.median(res[(name, 1)])), float(np.median(res[(name, 5)]))
        print(f"{name:7s}: first step ({len(prompt)} positions) {g1 * 1e3:.1f} ms, each later draft step "
              f"{(g5 - g1) / 4 * 1e3:.1f} ms; drafts {drafts[name]}")


if __name__ == "__main__":
    main()
