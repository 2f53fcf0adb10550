"""How often a draft head's first draft is the target's next token on the target's own answers, teacher-forced, beside
what the engine measured on the same answers: is a head's low acceptance the head, or how the engine uses it?

    python tools/head_agreement.py RUN.jsonl.gz [--per 2] [--max-tokens 200] [--head DIR[,DIR]]

RUN: a benchmark's records with the target alone's texts and the speculative run's stats (e.g. Spec-Bench on a GPU,
docs/results/h100_trees_specbench/specbench/sb_head_cost.jsonl.gz). For the first --per records of each category:
the prompt and the target's first answer (up to --max-tokens ids) in one forward of the CPU target (its features and
its greedy token at every position), the head over all of them at once (position t reads the target's f_t and
token t+1, as drafting's first step does), and the share of answer positions where the head's top token is the
target's greedy one (`top1`). `same`: the share of the answer that the CPU target's greedy tokens reproduce (the
texts came from another engine); `vocab`: the share of answer ids the head cannot propose (ids >= its head_vocab);
`engine`: the speculative record's first-position acceptance (its whole answer, every turn) and tau.
--head-vocab N: the same head proposing among the first N ids (how much its vocabulary slice costs). --head A,B: each
head on the same target forward (e.g. a float16 head and its int4 file: what compression costs, no round diverging).
The last rows: the mean over answers, and over all answer positions.
"""
from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np

import minitorch
from minitorch import from_numpy, tensor as make_tensor
from minitorch.models import load_model
from minitorch.models.draft_head import target_fingerprint
from minitorch.models.head_io import load_head
from project.evaluation.data import read_json_rows

SHIPPED = Path(__file__).resolve().parent.parent / "heads" / "qwen2.5-coder-1.5b-instruct"


def agreement(model, heads, prompt: list[int], answer: list[int],
              windows: tuple[int, ...] = (0,)) -> tuple[list[float], float]:
    """([top1 for each head, each prompt window], same) over the answer's positions (module docstring), one target
    forward for all. A window W > 0: the head reads only the prompt's last W positions, as HeadDrafter(prompt_window=W)
    does."""
    ids = prompt + answer
    p = len(prompt)
    with minitorch.no_grad():
        logits, hidden = model(ids, model.new_cache(len(ids) + 8), return_hidden=True)
        greedy = np.asarray(logits.to_numpy())[0].argmax(-1)  # greedy[t]: the target's token after position t
        f = np.asarray(hidden.to_numpy(), np.float32).reshape(len(ids), -1)
        top1 = []
        at = slice(p - 1, len(ids) - 2)  # head position t predicts token t + 2: the answer's second token onwards
        for head, w in ((h, w) for h in heads for w in windows):
            b = max(0, p - 1 - w) if w else 0  # the head's first position
            emb = model.model.embed_tokens(make_tensor([ids[b + 1:]], dtype="int64", backend=head.backend))
            g = head(from_numpy(f[b:-1][None], backend=head.backend), emb, head.new_cache(len(ids) + 8))
            drafts = np.asarray(head.logits(g, model.lm_head_weight(), head.config.head_vocab).to_numpy())[0].argmax(-1)
            top1.append(float((drafts[at.start - b:at.stop - b] == greedy[1:][at]).mean()))
    same = float((greedy[p - 1:len(ids) - 1] == np.asarray(answer)).mean())
    return top1, same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a benchmark's JSONL (.gz) with target and spec records")
    ap.add_argument("--per", type=int, default=2, help="records of each category (default 2)")
    ap.add_argument("--max-tokens", type=int, default=200, help="answer ids read per record (default 200)")
    ap.add_argument("--head", default=str(SHIPPED), metavar="DIR[,DIR]",
                    help="the head's folder (default: the shipped head); a comma list: each on the same target run")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--head-vocab", type=int, default=None, metavar="N",
                    help="propose among the first N ids instead of the head's own head_vocab (its LM head is the "
                    "target's: any N up to the vocabulary reads the same trained layer)")
    ap.add_argument("--prompt-windows", default="0", metavar="W[,W]",
                    help="the head reads only the prompt's last W positions (0: all; a comma list: each, one target "
                    "run; default 0)")
    ap.add_argument("--categories", default=None, metavar="CAT[,CAT]", help="only these categories")
    args = ap.parse_args()
    windows = tuple(int(w) for w in args.prompt_windows.split(","))
    model, tok = load_model(args.target, progress=False)
    heads = [load_head(d, model) for d in args.head.split(",")]
    if args.head_vocab:
        for head in heads:
            head.config.head_vocab = min(args.head_vocab, model.config.vocab_size)
    head = heads[0]  # the vocabulary share below is the first head's
    print(f"target {args.target} ({target_fingerprint(model)}), head {args.head} (head_vocab {head.config.head_vocab})")
    rows = read_json_rows(Path(args.run))
    spec = {r["id"]: r for r in rows if r.get("mode") == "spec"}
    by_cat: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if args.categories and r.get("category") not in args.categories.split(","):
            continue
        if r.get("mode") == "target" and len(by_cat[r.get("category")]) < args.per:
            by_cat[r.get("category")].append(r)
    tab: dict[str, list[tuple[float, ...]]] = defaultdict(list)
    for cat, recs in by_cat.items():
        for r in recs:
            text = r["turns"][0]["text"] if r.get("turns") else r["text"]
            prompt, answer = tok.encode(r["prompt"]), tok.encode(text)[:args.max_tokens]
            if len(answer) < 3:
                continue
            top1s, same = agreement(model, heads, list(prompt), list(answer), windows)
            vocab = float(np.mean(np.asarray(answer) >= head.config.head_vocab))
            s = spec.get(r["id"], {})
            pos0 = (s.get("per_position_acceptance") or [float("nan")])[0]
            tab[cat].append((*top1s, len(answer) - 1, pos0))  # the positions scored, for the "all" row
            top1 = " / ".join(f"{t:.3f}" for t in top1s)
            print(f"{cat:15s} {r['id']:16s} prompt {len(prompt):4d} answer {len(answer):4d}  top1 {top1}  "
                  f"same {same:.3f}  vocab {vocab:.3f}  | engine first-position {pos0:.3f} tau {s.get('tau', 0):.2f}",
                  flush=True)
    cols = [f"top1 ({'head ' + str(i) + ', ' if len(heads) > 1 else ''}window {w or 'all'})"
            for i in range(len(heads)) for w in windows]
    print(f"category means: {' / '.join(cols)} / engine first-position")
    every = np.concatenate([np.asarray(v) for v in tab.values()])
    for cat, a in [*((c, np.asarray(v)) for c, v in tab.items()), ("all", every)]:
        print(f"  {cat:15s} " + " / ".join(f"{a[:, i].mean():.3f}" for i in range(len(cols)))
              + f" / {np.nanmean(a[:, -1]):.3f}")
    w = every[:, len(cols)]  # each answer's share weighed by its positions: agreement over all positions
    print(f"  {'all positions':15s} " + " / ".join(f"{(every[:, i] * w).sum() / w.sum():.3f}" for i in range(len(cols)))
          + f"  ({int(w.sum())} positions)")


if __name__ == "__main__":
    main()
