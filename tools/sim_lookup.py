"""Prompt lookup on a benchmark's greedy outputs, exact: a greedy target's text is fixed, so a draft is accepted as far
as it agrees with it, and prompt lookup's tokens a round follow from the text alone, with no model run. Beside the
head's measured tau per category, and the policy of --draft-lookup M ("lookup where an n-gram of M or more tokens
matched, else the head"), whose head rounds are modelled by the head's measured acceptance by position (as if it did
not depend on where a round starts: an estimate).

    PYTHONPATH=. python tools/sim_lookup.py RESULTS.jsonl.gz [--gamma 4] [--max-tokens N]

RESULTS: a Spec-Bench results file with spec (a head) and target records (benchmark_specbench.py's)."""
import argparse
import collections

import numpy as np

from minitorch.generation.drafters import lookup_match
from minitorch.models.tokenizer import load_tokenizer
from project.evaluation.runner import read_results

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("results")
p.add_argument("--gamma", type=int, default=4, help="drafts a round (default 4, the head's GPU gamma)")
p.add_argument("--max-tokens", type=int, default=None, help="only the first N tokens of each answer")
p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct", help="whose tokenizer (default the offline target)")
args = p.parse_args()
G = args.gamma
tok = load_tokenizer(args.target, progress=False)
rows = read_results(args.results)  # plain or gzip (told by the bytes)
spec = {r["id"]: r for r in rows if r["mode"] == "spec"}
agg: dict = collections.defaultdict(collections.Counter)
for r in rows:
    if r["mode"] != "target" or r["id"] not in spec:
        continue
    s = spec[r["id"]]
    e_head, q = 1.0, 1.0  # a head round's expected tokens: 1 + a_1 + a_1 a_2 + ...
    for a in (s.get("per_position_acceptance") or [])[:G]:
        q *= a
        e_head += q
    c = agg[r["category"]]
    ctx = list(tok.encode(r["prompt"]))
    for t in r.get("turns") or [{"text": r["text"]}]:
        out = list(tok.encode(t["text"]))[:args.max_tokens]
        i = 0
        while i < len(out):
            d, n = lookup_match(ctx + out[:i], G, 3, 1)
            k = 0
            while k < len(d) and i + k < len(out) and d[k] == out[i + k]:
                k += 1
            c["rounds"] += 1
            c["tokens"] += k + 1
            c["head"] += e_head
            for m in (1, 2, 3):
                c[f"match{m}"] += bool(d) and n >= m
                c[f"mix{m}"] += (k + 1) if d and n >= m else e_head
            i += k + 1
        ctx += out  # the next turn sees this answer (its template tokens left out)
    c["head_tau"] += s["tau"] or 0.0
    c["n"] += 1
print(f"tokens a round, gamma {G}{f', first {args.max_tokens} tokens of each answer' if args.max_tokens else ''}; "
      "match M: share of rounds with an n-gram match of M or more; mix M: --draft-lookup M (head rounds modelled)")
print(f"{'category':15s} {'lookup':>7s} {'match1':>6s} {'match2':>6s} {'match3':>6s} {'head':>6s} {'model':>6s} "
      f"{'mix1':>6s} {'mix2':>6s} {'mix3':>6s}")
tot = collections.Counter()
for cat, c in agg.items():
    R = c["rounds"]
    print(f"{cat:15s} {c['tokens'] / R:7.2f} {c['match1'] / R:6.2f} {c['match2'] / R:6.2f} {c['match3'] / R:6.2f} "
          f"{c['head_tau'] / c['n']:6.2f} {c['head'] / R:6.2f} {c['mix1'] / R:6.2f} {c['mix2'] / R:6.2f} "
          f"{c['mix3'] / R:6.2f}")
    tot.update(c)
R = tot["rounds"]
print(f"{'all (by round)':15s} {tot['tokens'] / R:7.2f} {tot['match1'] / R:6.2f} {tot['match2'] / R:6.2f} "
      f"{tot['match3'] / R:6.2f} {tot['head_tau'] / tot['n']:6.2f} {tot['head'] / R:6.2f} {tot['mix1'] / R:6.2f} "
      f"{tot['mix2'] / R:6.2f} {tot['mix3'] / R:6.2f}")
