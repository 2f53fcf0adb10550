"""Benchmark problems: named datasets (the copies in the repository's data/ folder, or the hub), --data-file, slicing
and shards, and the reasoning prompt built with the model's chat template."""
from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

from .grading import gold_answer

REASONING_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA_DIR = ROOT / "data"
DATA_ENV = "MINITORCH_SPEC_DATA"


class BenchmarkError(ValueError):
    """A user mistake (bad file, flag or results file); the programs print it as one line, exit 2."""


class Tokenizer(Protocol):
    """What the benchmarks need from a tokenizer (minitorch.models tokenizers have it)."""

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str: ...


@dataclass(frozen=True)
class Problem:
    """One benchmark problem: a unique id, its position in the dataset, the question and gold answer. A
    conversation (Spec-Bench) has no gold answer ("": not graded), its user turns (`question` is the first) and a
    category; its prompt is the chat template alone, without the reasoning instruction."""

    id: str
    index: int
    question: str
    gold: str
    turns: tuple[str, ...] = ()
    category: str | None = None

    @property
    def graded(self) -> bool:
        return bool(self.gold)


@dataclass(frozen=True)
class DatasetSpec:
    """Where a named dataset lives (a file under the data dir, or the hub) and how to read its rows."""

    name: str
    local: str | None  # path relative to the data dir
    hub: tuple[str, str | None, str] | None = None  # (repo, config, split) for `datasets.load_dataset`


DATASETS: dict[str, DatasetSpec] = {
    "gsm8k": DatasetSpec("gsm8k", "gsm8k/test.jsonl", ("openai/gsm8k", "main", "test")),
    "math500": DatasetSpec("math500", "limo/eval/math500.jsonl", ("HuggingFaceH4/MATH-500", None, "test")),
    "aime24": DatasetSpec("aime24", "limo/eval/aime24.jsonl"),
    "amc23": DatasetSpec("amc23", "limo/eval/amc23.jsonl"),
    "limo": DatasetSpec("limo", None, ("GAIR/LIMO", None, "train")),
    "spec_bench": DatasetSpec("spec_bench", "spec_bench/question.jsonl"),
}
QUESTION_FIELDS = ("question", "problem", "prompt", "input")


def data_stem(path: str | Path) -> str:
    """A data file's name without .gz and .json/.jsonl: the prefix of its problem ids (train.jsonl.gz -> train)."""
    name = Path(path).name
    for suffix in (".gz", ".jsonl", ".json"):
        name = name[:-len(suffix)] if name.endswith(suffix) else name
    return name


GZIP_MAGIC = b"\x1f\x8b"  # a gzip file's first two bytes


def gunzipped(data: bytes) -> bytes:
    """A file's bytes as their text: decompressed when they are gzip's (told by the bytes, not the file's name)."""
    return gzip.decompress(data) if data[:2] == GZIP_MAGIC else data


def read_json_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a .jsonl file (one object a line) or a .json file holding a list of objects; either may be
    gzipped (.jsonl.gz: how the repository ships GSM8K's train split)."""
    path = Path(path)
    if not path.is_file():
        raise BenchmarkError(f"data file not found: {path}")
    text = gunzipped(path.read_bytes()).decode("utf-8")
    if path.name.removesuffix(".gz").endswith(".json"):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise BenchmarkError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        if not isinstance(rows, list):
            raise BenchmarkError(f"{path}: expected a JSON list of objects")
    else:
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise BenchmarkError(f"{path}:{n}: not valid JSON ({e.msg})") from None
    if not all(isinstance(r, dict) for r in rows):
        raise BenchmarkError(f"{path}: every row must be a JSON object")
    return rows


def conversation(row: Mapping[str, Any], i: int, prefix: str) -> Problem:
    """A Spec-Bench row (`question_id`, `category`, `turns`: the user's messages) as an ungraded conversation."""
    turns = row["turns"]
    if not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise BenchmarkError(f"{prefix} row {i}: 'turns' must be a list of non-empty strings")
    qid = row.get("question_id", row.get("id", i))
    category = row.get("category")
    return Problem(f"{prefix}-{qid}", i, turns[0], "", tuple(turns), str(category) if category is not None else None)


def rows_to_problems(rows: Sequence[Mapping[str, Any]], prefix: str) -> list[Problem]:
    """Problems from dataset rows: question from the first of QUESTION_FIELDS, gold via grading; a row with
    `turns` (Spec-Bench) is a conversation (conversation())."""
    problems = []
    for i, row in enumerate(rows):
        if isinstance(row.get("turns"), list):
            problems.append(conversation(row, i, prefix))
            continue
        field = next((f for f in QUESTION_FIELDS if isinstance(row.get(f), str)), None)
        if field is None:
            raise BenchmarkError(f"{prefix} row {i}: no question field (expected one of {QUESTION_FIELDS})")
        try:
            gold = gold_answer(dict(row))
        except ValueError as e:
            raise BenchmarkError(f"{prefix} row {i}: {e}") from None
        if row.get("unique_id") is not None:
            pid = str(row["unique_id"])
        elif row.get("id") is not None:
            pid = f"{prefix}-{row['id']}"
        else:
            pid = f"{prefix}-{i}"
        problems.append(Problem(pid, i, row[field], gold))
    ids = [p.id for p in problems]
    if len(set(ids)) != len(ids):
        dup = next(x for x in ids if ids.count(x) > 1)
        raise BenchmarkError(f"{prefix}: problem id {dup!r} appears more than once")
    return problems


def load_problems(name: str | None = None, data_file: str | Path | None = None,
                  data_dir: str | Path | None = None, hub: bool = False) -> list[Problem]:
    """Problems of a named dataset (local copy, or the hub when `hub`), or of `data_file`."""
    if data_file is not None:
        path = Path(data_file)
        return rows_to_problems(read_json_rows(path), data_stem(path))
    if name not in DATASETS:
        raise BenchmarkError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)} or pass --data-file")
    spec = DATASETS[name]
    if hub or spec.local is None:
        if spec.hub is None:
            raise BenchmarkError(f"dataset {name!r} has no hub source; use the local copy or --data-file")
        try:
            import datasets  # optional: only for hub loading
        except ImportError:
            raise BenchmarkError(
                f"dataset {name!r} comes from the hub ({spec.hub[0]}) and needs the 'datasets' package "
                "(pip install datasets); offline, pass --data-file") from None
        repo, config, split = spec.hub
        try:
            rows = list(datasets.load_dataset(repo, config, split=split))
        except Exception as e:  # network / hub errors reach the user as one line
            raise BenchmarkError(f"could not load {repo} from the hub: {type(e).__name__}: {e}") from None
        return rows_to_problems(rows, name)
    base = Path(data_dir) if data_dir is not None else Path(os.environ.get(DATA_ENV, DEFAULT_DATA_DIR))
    path = base / spec.local
    if not path.is_file():
        raise BenchmarkError(f"{name}: {path} not found; pass --data-dir (a folder laid out like the repository's data/) or --data-file")
    return rows_to_problems(read_json_rows(path), name)


def select_categories(problems: Sequence[Problem], categories: str | None = None,
                      per_category: int | None = None) -> list[Problem]:
    """The problems of the comma-listed categories (None: all), at most the first per_category of each."""
    known = list(dict.fromkeys(p.category for p in problems if p.category is not None))
    wanted = None
    if categories:
        wanted = [c.strip() for c in categories.split(",") if c.strip()]
        bad = [c for c in wanted if c not in known]
        if bad or not wanted:
            raise BenchmarkError(f"--category {categories!r}: choose among {', '.join(known) or 'none (this data has no categories)'}")
    if per_category is not None and per_category < 1:
        raise BenchmarkError(f"--per-category must be >= 1, got {per_category}")
    seen: dict[str | None, int] = {}
    out = []
    for p in problems:
        if wanted is not None and p.category not in wanted:
            continue
        seen[p.category] = seen.get(p.category, 0) + 1
        if per_category is None or seen[p.category] <= per_category:
            out.append(p)
    return out


def parse_shard(text: str) -> tuple[int, int]:
    """'i/n' -> (i, n) with 0 <= i < n."""
    try:
        i_s, n_s = text.split("/")
        i, n = int(i_s), int(n_s)
    except ValueError:
        raise BenchmarkError(f"--shard must look like i/n (e.g. 0/4), got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise BenchmarkError(f"--shard {text}: need 0 <= i < n")
    return i, n


def select_problems(problems: Sequence[Problem], offset: int = 0, limit: int | None = None,
                    shard: tuple[int, int] = (0, 1)) -> list[Problem]:
    """problems[offset : offset + limit], then every n-th from i for shard (i, n)."""
    if offset < 0:
        raise BenchmarkError(f"--offset must be >= 0, got {offset}")
    if limit is not None and limit < 1:
        raise BenchmarkError(f"--limit must be >= 1, got {limit}")
    if offset >= len(problems):
        raise BenchmarkError(f"--offset {offset} is past the end of the dataset ({len(problems)} problems)")
    chosen = list(problems[offset : None if limit is None else offset + limit])
    i, n = shard
    if i >= len(chosen):
        raise BenchmarkError(f"--shard {i}/{n} selects no problems: only {len(chosen)} after --offset/--limit")
    return chosen[i::n]


# ----------------------------------------------------------------------------- prompting

def conversation_prompt(tokenizer: Tokenizer, turns: Sequence[str], answers: Sequence[str]) -> str:
    """The chat-template prompt of a conversation's next turn: user turn i, the answer to it, ..., then the user's
    turn len(answers) (Spec-Bench's multi-turn setting: the second turn sees the first answer), no system turn of our
    own (the template's default) and no instruction."""
    messages: list[dict[str, str]] = []
    for i, answer in enumerate(answers):
        messages += [{"role": "user", "content": turns[i]}, {"role": "assistant", "content": answer}]
    messages.append({"role": "user", "content": turns[len(answers)]})
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True)


def build_prompt(tokenizer: Tokenizer, question: str, system_prompt: str | None = None) -> str:
    """The chat-template prompt: the question followed by the standard reasoning instruction.

    DeepSeek-R1-Distill models are meant to get the instruction in the user turn (no system prompt);
    `system_prompt` (LIMO's evaluation style puts the instruction there) adds a system turn.
    """
    messages = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
        messages.append({"role": "user", "content": question})
    else:
        messages.append({"role": "user", "content": f"{question}\n{REASONING_INSTRUCTION}"})
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True)
