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
Answer records carry their question, so train_draft_head.py --generated takes them as they are. --batch N writes
N items at once with the target alone (training/writer.py), each record as it finishes, in whatever order.
"""
from __future__ import annotations

import argparse
import re
from typing import Any, Iterator


from project.cli_common import run_cli
from project.one_line_parser import OneLineParser
from project.settings import UserError
from project.training.writer import Job, add_step_args, check_output, first_step_rows, kept_question, write_items

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
    p = OneLineParser(description="The target writes math problems, then answers them: training text for a draft "
                      "head that is not an evaluation set.")
    sub = p.add_subparsers(dest="step", required=True)
    a = sub.add_parser("problems", help="write --n problems (sampled)")
    a.add_argument("--n", type=int, default=600, help="problems to ask for (default 600)")
    a.add_argument("--start", type=int, default=0,
                   help="the first item's index (default 0): more problems after an earlier file's, with new ids and seeds")
    b = sub.add_parser("answers", help="answer the problems of a `problems` file (greedy)")
    b.add_argument("problems", help="the JSONL file `problems` wrote")
    add_step_args(a, 256, 0.8, 0.95)
    add_step_args(b, 512, 0.0, 1.0)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.step == "problems" and (args.n < 1 or args.start < 0):
        raise UserError(f"--n must be >= 1 and --start >= 0, got {args.n} and {args.start}")
    check_output(args)
    return args


def problem_items(n: int, start: int = 0) -> Iterator[tuple[str, dict[str, Any]]]:
    """(id, fields) of items start..start+n-1: subject, topic and level of combination i (cycling)."""
    combos = combinations()
    for i in range(start, start + n):
        subject, topic, level = combos[i % len(combos)]
        yield f"self-{i}", {"index": i, "subject": subject, "topic": topic, "level": level}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    mode = "target" if args.batch > 1 else "spec"  # an answer record's mode: --batch N runs the target alone
    from project.evaluation.data import build_prompt

    def problem(tok: Any, item: dict[str, Any]) -> Job:
        seed = args.seed + item["index"]
        res = yield problem_prompt(tok, item["subject"], item["topic"], item["level"]), args.max_new_tokens, seed
        text = tok.decode(list(res.tokens))
        question = kept_question(clean_problem(text) if res.stop_reason == "stop" else None)
        rec = {**item, "question": question, "seed": seed}
        if question is None:
            rec["raw"] = text  # kept so a changed cleaning rule can be checked against it
        return {**rec, "generated_tokens": len(res.tokens), "stop_reason": res.stop_reason}, len(res.tokens)

    def answer(tok: Any, item: dict[str, Any]) -> Job:
        res = yield list(tok.encode(build_prompt(tok, item["question"]))), args.max_new_tokens, args.seed
        rec = {"question": item["question"], "subject": item.get("subject"), "level": item.get("level"),
               "mode": mode, "text": tok.decode(list(res.tokens))}
        return {**rec, "generated_tokens": len(res.tokens), "stop_reason": res.stop_reason}, len(res.tokens)

    if args.step == "problems":
        return write_items(args, problem_items(args.n, args.start), problem)
    return write_items(args, [(r["id"], r) for r in first_step_rows(args.problems, "problems")], answer)


if __name__ == "__main__":
    run_cli(main)
