"""What the programs that have the target write its own training text share (project/write_problems.py: math
problems, then answers; project/write_chat.py: requests of every kind, then answers): the two steps' common flags,
the first step's file read back by the second, a kept question, and the resumable loop that writes one JSON record
an item as it finishes.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from project.settings import UserError

# one item: (tokenizer, generator, item) -> (the record's fields, the tokens generated)
WriteOne = Callable[[Any, Any, dict[str, Any]], tuple[dict[str, Any], int]]


def add_step_args(p: argparse.ArgumentParser, max_new_tokens: int, temperature: float, top_p: float) -> None:
    """--output, --resume, --no-progress and the engine's flags, with this step's defaults."""
    from project.evaluation.engine import add_engine_args

    p.add_argument("--output", "-o", required=True, help="the JSONL file to write (one record a line)")
    p.add_argument("--resume", action="store_true", help="continue --output, skipping the items it holds")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_engine_args(p, max_new_tokens)
    p.set_defaults(temperature=temperature, top_p=top_p)


def check_output(args: argparse.Namespace) -> None:
    """A non-empty --output is continued only with --resume."""
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
    """Run write_one for every (id, item) not yet in --output and append its record as it finishes (an interrupted
    run keeps every finished item), with a progress bar; returns the exit status."""
    from tqdm import tqdm

    from project.evaluation.data import read_json_rows
    from project.evaluation.engine import load_engine

    out = Path(args.output)
    done = {r.get("id") for r in read_json_rows(out)} if out.exists() else set()
    todo = [(i, item) for i, item in items if i not in done]
    print(f"{args.step}: {len(todo)} to write, {len(done)} already in {out}", file=sys.stderr)
    if not todo:
        return 0
    engine = load_engine(args, ["spec"])
    tok, gen = engine.tokenizer, engine.modes["spec"]
    out.parent.mkdir(parents=True, exist_ok=True)
    kept = tokens = 0
    t0 = time.perf_counter()
    with out.open("a", encoding="utf-8") as f, tqdm(todo, desc=args.step, unit="item", disable=args.no_progress) as bar:
        for item_id, item in bar:
            fields, n = write_one(tok, gen, item)
            rec = {"id": item_id, **fields}
            f.write(json.dumps(rec) + "\n")
            f.flush()
            tokens += n
            kept += rec.get("question") is not None
            bar.set_postfix(kept=kept, tok_s=f"{tokens / (time.perf_counter() - t0):.0f}")
    print(f"{args.step}: wrote {len(todo)} ({kept} with a question; {tokens} tokens in "
          f"{time.perf_counter() - t0:.1f} s) to {out}", file=sys.stderr)
    return 0
