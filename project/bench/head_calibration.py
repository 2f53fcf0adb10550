"""How well a draft head's confidence predicts its acceptance: the evidence behind the draft budget's gate
(minitorch/generation/budget.py). Greedy speculative decoding at a fixed gamma on the first Spec-Bench question(s)
of each category; every judged draft is binned by the head's top probability at its position (its confidence,
as the gate reads it), and each bin's acceptance printed beside it, by draft position.

    python project/bench/head_calibration.py                 the first question of each of the 13 categories
    python project/bench/head_calibration.py --per 2 --gamma 3 --max-new-tokens 128 --json calibration.json

A draft is judged when every draft before it in its round was accepted. Where acceptance tracks confidence, the
product of the confidences of a round's drafts so far is the chance they are all accepted, which is what the gate
weighs against a verify row's cost.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from minitorch.generation import head_drafter as hd
from project.cli_common import encode_prompt, load_models, run_cli
from project.settings import add_engine_args, resolve_settings

ROOT = Path(__file__).resolve().parents[2]
BINS = ((0.0, 0.2), (0.2, 0.4), (0.4, 0.6), (0.6, 0.8), (0.8, 0.9), (0.9, 1.0001))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_engine_args(p)
    p.add_argument("--per", type=int, default=1, help="questions a category (default 1)")
    p.add_argument("--json", default=None, help="write every judged draft (category, position, confidence, accepted)")
    args = p.parse_args(["--drafter", "head", "--gamma", "3", "--draft-budget", "fixed"] + (argv or sys.argv[1:]))
    models = load_models(resolve_settings(args), progress=False)
    confidences: list[list[float]] = []  # one list a propose: the head's top probability before each draft
    step, propose = hd.HeadDrafter._step, hd.HeadDrafter.propose

    def watched_step(self, feats, ids):
        last, row = step(self, feats, ids)
        if confidences and getattr(self, "_proposing", False):
            confidences[-1].append(hd.top_probability(row))
        return last, row

    rounds: list[tuple[int, list[int]]] = []

    def watched_propose(self, tokens, gamma, cfg, rng, gate=None):
        confidences.append([])
        self._proposing = True
        try:
            drafts, q = propose(self, tokens, gamma, cfg, rng, gate)
        finally:
            self._proposing = False
        rounds.append((len(tokens), drafts))
        return drafts, q

    hd.HeadDrafter._step, hd.HeadDrafter.propose = watched_step, watched_propose
    engine, judged, seen = models.engine(), [], {}
    for line in (ROOT / "data" / "spec_bench" / "question.jsonl").read_text().splitlines():
        q = json.loads(line)
        if seen.get(q["category"], 0) >= args.per:
            continue
        seen[q["category"]] = seen.get(q["category"], 0) + 1
        ids = encode_prompt(models.tokenizer, q["turns"][0], True)
        confidences.clear(), rounds.clear()
        res = engine.generate(ids, models.settings.max_new_tokens)
        full = ids + res.tokens
        for (n, drafts), confs in zip(rounds, confidences):
            for i, tok in enumerate(drafts):
                if n + i >= len(full):
                    break
                judged.append((q["category"], i + 1, confs[i], full[n + i] == tok))
                if full[n + i] != tok:
                    break
        print(f"{q['category']:16s} tau {res.stats['tau']:.2f}", file=sys.stderr)
    for pos in sorted({j[1] for j in judged}):
        rows = [(c, a) for _, i, c, a in judged if i == pos]
        print(f"draft position {pos}: {len(rows)} judged, {np.mean([a for _, a in rows]):.3f} accepted")
        for lo, hi in BINS:
            b = [a for c, a in rows if lo <= c < hi]
            if b:
                print(f"  confidence {lo:.1f}-{min(hi, 1.0):.1f}: {len(b):4d} drafts ({len(b) / len(rows):.2f}), "
                      f"accepted {np.mean(b):.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps([list(j) for j in judged]))
    return 0


if __name__ == "__main__":
    run_cli(main)
