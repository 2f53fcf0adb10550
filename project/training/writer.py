"""What the programs that have the target write its own training text share (project/write_problems.py: math
problems, then answers; project/write_chat.py: requests of every kind, then answers): the two steps' common flags,
the first step's file read back by the second, a kept question, and the resumable loop that writes one JSON record
an item as it finishes.

An item's work is a job (project/evaluation/batch.py): a generator that yields each generation it needs as
`(prompt_ids, max_new_tokens, seed)`, receives the result and returns `(the record's fields, tokens generated)`. With
--batch 1 (default) the items run one after another with the speculative engine, in order. With --batch N the target
alone decodes N sequences at once (minitorch's Engine.generate_batch): items finish out of order and each record is
appended, flushed, as it finishes, so an interrupted run keeps every finished item; --resume skips the items whose id
the file holds (the id, never the line count, since the lines are in finishing order), and the texts equal a run of
one at a time with the target alone (each generation samples with its own seed).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from project.evaluation.batch import Job, run_job, run_jobs
from project.settings import UserError, add_batch_args

# one item: (tokenizer, item) -> its job, which returns (the record's fields, the tokens generated)
WriteOne = Callable[[Any, dict[str, Any]], Job]


def add_step_args(p: argparse.ArgumentParser, max_new_tokens: int, temperature: float, top_p: float) -> None:
    """--output, --resume, --no-progress, --batch and the engine's flags, with this step's defaults."""
    from project.evaluation.engine import add_engine_args

    p.add_argument("--output", "-o", required=True, help="the JSONL file to write (one record a line)")
    p.add_argument("--resume", action="store_true", help="continue --output, skipping the items it holds")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_batch_args(p)
    add_engine_args(p, max_new_tokens)
    p.set_defaults(temperature=temperature, top_p=top_p)


def check_output(args: argparse.Namespace) -> None:
    """A non-empty --output is continued only with --resume; the engine's flags are checked before anything loads."""
    from project.settings import resolve_settings

    resolve_settings(args)
    out = Path(args.output)
    if out.exists() and out.stat().st_size and not args.resume:
        raise UserError(f"{out} exists; pass --resume to continue it or choose another --output")


def first_step_rows(path: str, kind: str) -> list[dict[str, Any]]:
    """The records the first step wrote (`kind`: what it wrote), those with a kept question."""
    from project.evaluation.data import read_json_rows

    src = Path(path)
    if not src.is_file():
        raise UserError(f"{kind} file not found: {src}")
    rows = read_json_rows(src)
    if any("question" not in r or "id" not in r for r in rows):
        raise UserError(f"{src}: not a `{kind}` file (rows need 'id' and 'question')")
    return [r for r in rows if r["question"]]


def kept_question(text: str | None) -> str | None:
    """A question the target wrote, unless it is an evaluation question word for word (never training text)."""
    from project.training.data import is_evaluation_question

    return None if text is None or is_evaluation_question(text) else text


def write_items(args: argparse.Namespace, items: Iterable[tuple[str, dict[str, Any]]], write_one: WriteOne) -> int:
    """Run write_one's job for every (id, item) not yet in --output (by id) and append its record as it finishes (an
    interrupted run keeps every finished item), one at a time or --batch N at once, with a progress bar; returns the
    exit status."""
    from tqdm import tqdm

    from project.evaluation.engine import load_engine
    from project.evaluation.runner import read_results

    out = Path(args.output)
    # a last line cut off by a kill mid-write (SIGKILL, a machine's time limit) is cut from the file, then resumed
    done = {r["id"] for r in read_results(out, repair=True, keys=("id",))}
    todo = [(i, item) for i, item in items if i not in done]
    print(f"{args.step}: {len(todo)} to write, {len(done)} already in {out}", file=sys.stderr)
    if not todo:
        return 0
    engine = load_engine(args, ["spec"])
    tok = engine.tokenizer
    out.parent.mkdir(parents=True, exist_ok=True)
    kept = tokens = 0
    t0 = time.perf_counter()
    jobs = ((item_id, write_one(tok, item)) for item_id, item in todo)
    finished = (run_jobs(jobs, engine.batch) if args.batch > 1
                else ((item_id, run_job(job, engine.modes["spec"])) for item_id, job in jobs))
    with out.open("a", encoding="utf-8") as f, tqdm(total=len(todo), desc=args.step, unit="item",
                                                     disable=args.no_progress) as bar:
        for item_id, (fields, n) in finished:
            rec = {"id": item_id, **fields}
            f.write(json.dumps(rec) + "\n")
            f.flush()
            tokens += n
            kept += rec.get("question") is not None
            bar.update(1)
            bar.set_postfix(kept=kept, tok_s=f"{tokens / (time.perf_counter() - t0):.0f}")
    print(f"{args.step}: wrote {len(todo)} ({kept} with a question; {tokens} tokens in "
          f"{time.perf_counter() - t0:.1f} s) to {out}", file=sys.stderr)
    return 0
