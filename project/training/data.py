"""Training text for a draft head: GSM8K's train split (and answers the target wrote itself), as token sequences
under the benchmark's own chat template, so the head learns the context it will draft in.

A sequence is prompt + answer + end-of-turn; the loss covers the answer's positions only. GSM8K's answers
carry calculator annotations `<<48/2=24>>` the target never writes: they are stripped, and the final line
`#### 72` becomes the benchmark's requested form, `\\boxed{72}`.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from project.evaluation.data import DATASETS, DEFAULT_DATA_DIR, BenchmarkError, build_prompt, load_problems, read_json_rows

ANNOTATION = re.compile(r"<<[^>]*>>")
FINAL = re.compile(r"\n?####\s*(.+?)\s*$")
EVAL_SETS = ("test.jsonl", "math500", "aime", "amc")  # names of evaluation files: never train on them


class TrainingDataError(ValueError):
    """A user error in the training data (missing file, an evaluation set, no usable rows)."""


@dataclass
class Sequence_:
    ids: list[int]
    n_prompt: int  # the first n_prompt ids are the prompt (no loss on predicting them)
    source: str
    spans: tuple[tuple[int, int], ...] = ()  # a conversation: each answer's ids [start, end); empty: [n_prompt, len)


def answer_spans(s: Sequence_) -> tuple[tuple[int, int], ...]:
    """The ids a sequence learns to draft, as [start, end) ranges: every answer of a conversation, else all after
    the prompt."""
    return s.spans or ((s.n_prompt, len(s.ids)),)


def clean_gsm8k_answer(answer: str) -> str:
    """A GSM8K answer as the target would write it: no calculator annotations, the final answer boxed."""
    text = ANNOTATION.sub("", answer).strip()
    m = FINAL.search(text)
    if m:
        final = m.group(1).replace(",", "")
        text = text[:m.start()].rstrip() + f"\nThe final answer is $\\boxed{{{final}}}$."
    return text


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a training file (.jsonl, or .jsonl.gz as data/gsm8k/train.jsonl.gz ships); evaluation sets are refused."""
    path = Path(path)
    if not path.is_file():
        raise TrainingDataError(f"training data {path} not found")
    low = str(path).lower()
    if any(name in low for name in EVAL_SETS):
        raise TrainingDataError(f"{path} looks like an evaluation set; train on data/gsm8k/train.jsonl.gz or "
                                "answers generated for its problems (never on GSM8K test, MATH-500, AIME, AMC)")
    try:
        return read_json_rows(path)
    except BenchmarkError as e:
        raise TrainingDataError(str(e)) from None


def gsm8k_sequences(tok: Any, rows: Sequence[dict[str, Any]], max_len: int, source: str = "gsm8k") -> list[Sequence_]:
    """prompt (benchmark template) + cleaned answer + end of turn, cut to max_len tokens."""
    end = _end_ids(tok)
    out = []
    for r in rows:
        if "question" not in r or "answer" not in r:
            raise TrainingDataError(f"{source}: rows need 'question' and 'answer' fields, got {sorted(r)}")
        prompt = list(tok.encode(build_prompt(tok, r["question"])))
        ids = prompt + list(tok.encode(clean_gsm8k_answer(r["answer"]))) + end
        if len(prompt) + 2 < max_len:
            out.append(Sequence_(ids[:max_len], len(prompt), source))
    return out


def generated_sequences(tok: Any, rows: Sequence[dict[str, Any]], questions: dict[str, str], max_len: int,
                        source: str, seen: set | None = None) -> list[Sequence_]:
    """Answers the target wrote (benchmark records: 'id', 'text', run on the train split; or records that carry their
    own 'question', e.g. project/write_problems.py's answers to problems the target wrote) under the same prompt; a
    record with 'messages' (project/write_chat.py) is a conversation: those turns under the chat template with no
    instruction (as Spec-Bench prompts), its last answer 'text'; it is one sequence, the whole conversation, whose
    every answer is learned (Sequence_.spans; each answer ended as it ended: a follow-up was asked only after a
    finished answer). No user turn may be an evaluation question."""
    end = _end_ids(tok)
    out, seen = [], set() if seen is None else seen  # a shared `seen`: a record in two files counts once
    for r in rows:
        own = isinstance(r.get("question"), str)
        q = r["question"] if own else questions.get(str(r.get("id")))
        if q is None or "text" not in r or r.get("mode") not in (None, "target", "spec"):
            continue
        chat = r.get("messages")  # a conversation (project/write_chat.py): its turns under the plain chat template
        users = [m["content"] for m in chat if m.get("role") == "user"] if isinstance(chat, list) else [q]
        if own and any(is_evaluation_question(u) for u in users):  # e.g. recalled from MATH-500 word for word
            continue
        key = (r["id"], r["text"])
        if key in seen:  # the spec and target records of a greedy run hold the same text
            continue
        seen.add(key)
        if isinstance(chat, list):  # one sequence: the whole conversation, learning every answer in it
            seq = _conversation(tok, chat, r["text"], r.get("stop_reason"), end, max_len, source)
        else:  # the answer after the benchmark's prompt
            prompt = list(tok.encode(build_prompt(tok, q)))
            ids = prompt + list(tok.encode(r["text"])) + (end if r.get("stop_reason") == "stop" else [])
            seq = Sequence_(ids[:max_len], len(prompt), source) if len(prompt) + 2 < max_len else None
        if seq is not None:
            out.append(seq)
    return out


def _conversation(tok: Any, chat: list[dict[str, str]], last: str, stop: str | None, end: list[int], max_len: int,
                  source: str) -> Sequence_ | None:
    """A conversation as one sequence (the last turn's prompt, its answer) whose every answer is a span: the earlier
    answers are in the prompt already, so one pass over the target's features learns them all. An earlier answer is
    learned where its ids sit where its own turn's prompt ends (else the turn's boundary tokenized otherwise and it
    is left out); None when no answer fits in max_len."""
    ids = list(tok.encode(tok.apply_chat_template(chat, add_generation_prompt=True)))
    spans = []
    for i, m in enumerate(chat):
        if m.get("role") == "assistant":
            start = len(tok.encode(tok.apply_chat_template(chat[:i], add_generation_prompt=True)))
            answer = list(tok.encode(m["content"])) + end
            if ids[start:start + len(answer)] == answer:
                spans.append((start, start + len(answer)))
    answer = list(tok.encode(last)) + (end if stop == "stop" else [])
    spans.append((len(ids), len(ids) + len(answer)))
    ids += answer
    spans = tuple((a, min(b, max_len)) for a, b in spans if a + 2 < max_len)  # as a single answer's: 2 ids at least
    return Sequence_(ids[:max_len], spans[0][0], source, spans) if spans else None


def _norm(question: str) -> str:
    return " ".join(question.lower().split())


@functools.lru_cache(maxsize=None)
def evaluation_questions(data_dir: str = str(DEFAULT_DATA_DIR)) -> frozenset[str]:
    """The questions of the evaluation sets in the data folder (GSM8K test, MATH-500, AIME, AMC, every turn of
    Spec-Bench; load_problems, as the benchmarks read them), whitespace and case folded: a record that carries its
    own question (a problem the target wrote) must not be one of them."""
    return frozenset(_norm(q) for name, spec in DATASETS.items()
                     if spec.local and (Path(data_dir) / spec.local).is_file()
                     for p in load_problems(name, data_dir=data_dir) for q in (p.turns or (p.question,)))


def is_evaluation_question(question: str) -> bool:
    return _norm(question) in evaluation_questions()


def _end_ids(tok: Any) -> list[int]:
    """The end-of-turn token the target writes (the tokenizer's eos token, e.g. <|im_end|>)."""
    name = (getattr(tok, "special_tokens", None) or {}).get("eos_token")
    tid = tok.backend.token_to_id(name) if name else None
    if tid is None and getattr(tok, "stop_token_ids", None):
        tid = min(tok.stop_token_ids)
    return [int(tid)] if tid is not None else []


def split_heldout(seqs: list[Sequence_], heldout: int) -> tuple[list[Sequence_], list[Sequence_]]:
    """The last `heldout` sequences are held out (never trained on) for the agreement report."""
    if heldout < 0 or heldout >= len(seqs):
        raise TrainingDataError(f"--heldout {heldout} must be in [0, {len(seqs)}) for {len(seqs)} sequences")
    return (seqs[:len(seqs) - heldout], seqs[len(seqs) - heldout:]) if heldout else (seqs, [])
