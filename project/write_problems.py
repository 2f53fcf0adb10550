"""Training text for a draft head that the target writes itself: competition-style math problems, then its own
answers to them under the benchmark's prompt. Two steps, each a separate run, each resumable (--resume).

    python project/write_problems.py problems --n 600 -o problems.jsonl [--backend cuda]
    python project/write_problems.py answers problems.jsonl -o answers.jsonl [--backend cuda]
    python project/train_draft_head.py --generated answers.jsonl ...

Why: the repository's MATH-style sets (MATH-500, AIME, AMC) are evaluation sets, never trained on, and a head
that has seen only GSM8K text drafts MATH-500 poorly (round 15 in docs/history/RESULTS_LOG.md: 1.01x, against 1.75x
on GSM8K). A problem the target wrote itself is not an evaluation problem, and its answer is the target's own
text under the benchmark's chat template: the distribution the head has to predict.

`problems` asks the target (sampling, default temperature 0.8 / top-p 0.95, seed --seed + i for item i) for one
new problem per item, cycling through the seven MATH subjects, a list of topics each and levels 1-5 (MATH's own
labels), and keeps the statement (clean_problem: no "Problem:" label, nothing from "Solution" on). `answers`
answers every kept problem with the benchmark's prompt (evaluation/data.py build_prompt), greedy by default.
Answer records carry their question, so train_draft_head.py --generated takes them as they are.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any, Iterator


from project.cli_common import run_cli
from project.one_line_parser import OneLineParser
from project.settings import UserError

# MATH's seven subjects (Hendrycks et al. 2021) and topics within each; item i takes combination i of their
# product with levels 1-5, in a fixed shuffled order, so any prefix of a run spreads over all subjects
SUBJECTS: dict[str, tuple[str, ...]] = {
    "Prealgebra": ("fractions and decimals", "percentages", "ratios and rates", "order of operations",
                   "area and perimeter", "primes and factors", "mean, median and mode", "unit conversions"),
    "Algebra": ("linear equations", "systems of linear equations", "quadratic equations", "functions and inverses",
                "exponents and radicals", "arithmetic and geometric sequences", "absolute value",
                "slopes and lines", "inequalities"),
    "Number Theory": ("divisibility", "modular arithmetic", "greatest common divisors and least common multiples",
                      "number bases", "digits of numbers", "remainders", "counting divisors", "prime factorization"),
    "Counting & Probability": ("permutations", "combinations", "probability of events", "binomial coefficients",
                               "Pascal's triangle", "expected value", "inclusion-exclusion", "arrangements with "
                               "restrictions"),
    "Geometry": ("triangles", "circles", "polygons and their angles", "similar triangles", "the Pythagorean theorem",
                 "coordinate geometry", "volume and surface area", "inscribed and circumscribed figures"),
    "Intermediate Algebra": ("polynomials and their roots", "Vieta's formulas", "inequalities and optimization",
                             "complex numbers", "logarithms", "functional equations", "conic sections",
                             "sequences and series", "rational functions"),
    "Precalculus": ("trigonometric identities", "vectors", "matrices and determinants",
                    "complex numbers in polar form", "polar coordinates", "parametric equations",
                    "rotations and projections", "inverse trigonometric functions"),
}
LEVELS = (1, 2, 3, 4, 5)
PROBLEM_REQUEST = ("Write one new math problem in the style of the MATH competition dataset.\n"
                   "Subject: {subject}. Topic: {topic}. Difficulty: level {level} of 5.\n"
                   "Write only the problem statement, with LaTeX in $...$ for the math. "
                   "Do not write a solution or the answer.")
MIN_CHARS, MAX_CHARS = 20, 1500  # a kept problem's length


def combinations() -> list[tuple[str, str, int]]:
    """Every (subject, topic, level), in a fixed shuffled order (numpy's generator, seed 0)."""
    import numpy as np

    combos = [(s, t, lv) for s, topics in SUBJECTS.items() for t in topics for lv in LEVELS]
    return [combos[j] for j in np.random.default_rng(0).permutation(len(combos))]


_LABEL = re.compile(r"^\s*(?:#+\s*)?(?:\*\*)?\s*(?:new\s+)?(?:math\s+)?problem(?:\s+statement)?\s*(?:\d+\s*)?"
                    r"(?:\([^)]*\)\s*)?[:.]?\s*(?:\*\*)?\s*[:.]?\s*", re.IGNORECASE)
_TAIL = re.compile(r"\n\s*(?:#+\s*)?(?:\*\*)?\s*(?:solution|answer|hint|note|explanation|step 1)\b", re.IGNORECASE)


def clean_problem(text: str) -> str | None:
    """The problem statement in what the target wrote: without a leading "Problem:" label (plain, bold or a
    heading) and without anything from a "Solution"/"Answer"/"Hint"/"Note" line on; None when what is left is
    shorter than MIN_CHARS or longer than MAX_CHARS characters."""
    text = text.replace("<|im_end|>", "").replace("<|endoftext|>", "").strip()
    text = _LABEL.sub("", text, count=1).strip()
    m = _TAIL.search("\n" + text)
    if m:
        text = ("\n" + text)[:m.start()].strip()
    text = text.strip().strip("-").strip()
    return text if MIN_CHARS <= len(text) <= MAX_CHARS else None


def problem_prompt(tok: Any, subject: str, topic: str, level: int) -> list[int]:
    """The request for one problem, through the target's chat template (its default system turn)."""
    msg = PROBLEM_REQUEST.format(subject=subject, topic=topic, level=level)
    return list(tok.encode(tok.apply_chat_template([{"role": "user", "content": msg}], add_generation_prompt=True)))


def build_parser() -> argparse.ArgumentParser:
    from project.evaluation.engine import add_engine_args

    p = OneLineParser(description="The target writes math problems, then answers them: training text for a draft "
                      "head that is not an evaluation set.")
    sub = p.add_subparsers(dest="step", required=True)
    a = sub.add_parser("problems", help="write --n problems (sampled)")
    a.add_argument("--n", type=int, default=600, help="problems to ask for (default 600)")
    a.add_argument("--start", type=int, default=0,
                   help="the first item's index (default 0): more problems after an earlier file's, with new ids and seeds")
    b = sub.add_parser("answers", help="answer the problems of a `problems` file (greedy)")
    b.add_argument("problems", help="the JSONL file `problems` wrote")
    for q, max_new, temperature, top_p in ((a, 256, 0.8, 0.95), (b, 512, 0.0, 1.0)):
        q.add_argument("--output", "-o", required=True, help="the JSONL file to write (one record a line)")
        q.add_argument("--resume", action="store_true", help="continue --output, skipping the items it holds")
        q.add_argument("--no-progress", action="store_true", help="no progress bar")
        add_engine_args(q, max_new)
        q.set_defaults(temperature=temperature, top_p=top_p)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.step == "problems" and (args.n < 1 or args.start < 0):
        raise UserError(f"--n must be >= 1 and --start >= 0, got {args.n} and {args.start}")
    out = Path(args.output)
    if out.exists() and out.stat().st_size and not args.resume:
        raise UserError(f"{out} exists; pass --resume to continue it or choose another --output")
    return args


def problem_items(n: int, start: int = 0) -> Iterator[tuple[str, dict[str, Any]]]:
    """(id, fields) of items start..start+n-1: subject, topic and level of combination i (cycling)."""
    combos = combinations()
    for i in range(start, start + n):
        subject, topic, level = combos[i % len(combos)]
        yield f"self-{i}", {"index": i, "subject": subject, "topic": topic, "level": level}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from tqdm import tqdm

    from project.evaluation.data import build_prompt, read_json_rows
    from project.evaluation.engine import load_engine
    from project.training.data import is_evaluation_question

    out = Path(args.output)
    done = {r.get("id") for r in read_json_rows(out)} if out.exists() else set()
    if args.step == "problems":
        todo = [(pid, f) for pid, f in problem_items(args.n, args.start) if pid not in done]
    else:
        src = Path(args.problems)
        if not src.is_file():
            raise UserError(f"problems file not found: {src}")
        rows = read_json_rows(src)
        if any("question" not in r or "id" not in r for r in rows):
            raise UserError(f"{src}: not a `problems` file (rows need 'id' and 'question')")
        todo = [(r["id"], r) for r in rows if r["question"] and r["id"] not in done]
    print(f"{args.step}: {len(todo)} to write, {len(done)} already in {out}", file=sys.stderr)
    if not todo:
        return 0
    engine = load_engine(args, ["spec"])
    tok, gen = engine.tokenizer, engine.modes["spec"]
    out.parent.mkdir(parents=True, exist_ok=True)
    kept = tokens = 0
    t0 = time.perf_counter()
    with out.open("a", encoding="utf-8") as f, tqdm(todo, desc=args.step, unit="item", disable=args.no_progress) as bar:
        for pid, item in bar:
            if args.step == "problems":
                prompt = problem_prompt(tok, item["subject"], item["topic"], item["level"])
                seed = args.seed + item["index"]
            else:
                prompt = list(tok.encode(build_prompt(tok, item["question"])))
                seed = args.seed
            res = gen(prompt, args.max_new_tokens, seed)
            text = tok.decode(list(res.tokens))
            tokens += len(res.tokens)
            rec: dict[str, Any] = {"id": pid}
            if args.step == "problems":
                question = clean_problem(text) if res.stop_reason == "stop" else None
                if question is not None and is_evaluation_question(question):
                    question = None  # recalled from an evaluation set word for word: never training text
                rec.update(item, question=question, seed=seed)
                if question is None:
                    rec["raw"] = text  # kept so a changed cleaning rule can be checked against it
            else:
                rec.update(question=item["question"], subject=item.get("subject"), level=item.get("level"),
                           mode="spec", text=text)
            rec.update(generated_tokens=len(res.tokens), stop_reason=res.stop_reason)
            f.write(json.dumps(rec) + "\n")
            f.flush()  # an interrupted run keeps every finished item
            kept += rec.get("question") is not None
            bar.set_postfix(kept=kept, tok_s=f"{tokens / (time.perf_counter() - t0):.0f}")
    print(f"{args.step}: wrote {len(todo)} ({kept} with a question; {tokens} tokens in "
          f"{time.perf_counter() - t0:.1f} s) to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_cli(main)
