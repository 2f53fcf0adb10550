"""A head's chains with and without --draft-lookup (prompt lookup first), and the target alone, question by question
on Spec-Bench (first turns only), the CLI's CPU settings otherwise (cost budget, int8 activations); the runs of a
question in rotating order. One line a question: speedup over the target alone, the same without the prefill
(`dec`), tau, looked-up rounds / rounds, and whether the text is the target's (=).

    python tools/cpu_lookup_ab.py --per 3 --lookups 0,2 [--cats math,rag] [--out FILE.jsonl]
    python tools/cpu_lookup_ab.py --per 4 --lookups 0 --windows 0,128    the head reading only the prompt's last W
                                                                         positions (HeadDrafter prompt_window), as L0W128
    python tools/cpu_lookup_ab.py --summarize FILE.jsonl      the summary lines of an earlier run

Summary (printed at the end too), by mode: all questions' target seconds over their seconds, the median question,
how many below 0.95x and the lowest, and the same ratio by category."""
import argparse, json, statistics, sys, time
from collections import defaultdict


def summarize(path):
    rows = [json.loads(line) for line in open(path)]
    for k in [k for k in rows[0] if k not in ("id", "category", "prompt_tokens", "target")]:
        sp = [r["target"]["s"] / r[k]["s"] for r in rows]
        cat = defaultdict(lambda: [0.0, 0.0])
        for r in rows:
            cat[r["category"]][0] += r["target"]["s"]
            cat[r["category"]][1] += r[k]["s"]
        print(f"{k}: all {sum(r['target']['s'] for r in rows) / sum(r[k]['s'] for r in rows):.3f}x, median "
              f"{statistics.median(sp):.3f}x, below 0.95x {sum(x < 0.95 for x in sp)} of {len(sp)} (lowest "
              f"{min(sp):.3f}x); " + ", ".join(f"{c} {a / b:.2f}" for c, (a, b) in cat.items()))


if sys.argv[1:2] == ["--summarize"]:
    summarize(sys.argv[2])
    sys.exit(0)
from project.settings import add_engine_args, resolve_settings
from project.cli_common import load_models, encode_prompt
from project.evaluation.data import load_problems
from minitorch.generation.engine import DrafterSpec, make_engine

p = argparse.ArgumentParser(); add_engine_args(p)
p.add_argument("--per", type=int, default=3); p.add_argument("--lookups", default="0,2")
p.add_argument("--windows", default="0")
p.add_argument("--out", default="/tmp/lookup_ab.jsonl"); p.add_argument("--cats", default=None)
args = p.parse_args(sys.argv[1:] + ["--drafter", "head"])
m = load_models(resolve_settings(args), progress=False)
s = m.settings
engines = {}
for L in [int(x) for x in args.lookups.split(",")]:
    for W in [int(x) for x in args.windows.split(",")]:
        spec = DrafterSpec("head", head=m.head, gamma=s.gamma, adaptive=s.adaptive, lookup=L, prompt_window=W)
        engines[f"L{L}" + (f"W{W}" if W else "")] = make_engine(m.target, spec, s.sampling, m.stop_ids, m.vocab_size)
engines["target"] = engines[next(iter(engines))].alone()
next(iter(engines.values())).warm_up(batch=1)
probs = load_problems("spec_bench")
cats = defaultdict(list)
for q in probs:
    if args.cats is None or q.category in args.cats.split(","):
        if len(cats[q.category]) < args.per:
            cats[q.category].append(q)
names = list(engines)
out = open(args.out, "w")
k = 0
for cat, qs in cats.items():
    for q in qs:
        ids = encode_prompt(m.tokenizer, (q.turns or (q.question,))[0], chat=True)
        order = names[k % len(names):] + names[:k % len(names)]
        k += 1
        rec = {"id": q.id, "category": cat, "prompt_tokens": len(ids)}
        for name in order:
            t0 = time.perf_counter()
            r = engines[name].generate(ids, s.max_new_tokens)
            dt = time.perf_counter() - t0
            rec[name] = {"s": dt, "n": len(r.tokens), "tokens": r.tokens, "prefill": r.stats.get("time_prefill", 0.0),
                         "tau": r.stats.get("tau"), "lookup_rounds": r.stats.get("lookup_rounds"),
                         "rounds": r.stats.get("rounds")}
        t = rec["target"]
        line = f"{q.id:16s} {cat:14s} p={len(ids):5d} n={t['n']:4d}"
        for name in names[:-1]:
            e = rec[name]
            same = e["tokens"] == t["tokens"]
            sp = t["s"] / e["s"] * (e["n"] / max(t["n"], 1))
            dec = (t["s"] - t["prefill"]) / max(e["s"] - e["prefill"], 1e-9) * (e["n"] / max(t["n"], 1))
            line += f" | {name} {sp:.3f}x dec {dec:.3f}x tau {e['tau'] or 0:.2f} lk {e['lookup_rounds']}/{e['rounds']} {'=' if same else 'DIFF'}"
        print(line, flush=True)
        for name in names:
            rec[name].pop("tokens")
        out.write(json.dumps(rec) + "\n"); out.flush()
out.close()
summarize(args.out)
