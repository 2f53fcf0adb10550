"""The evaluation data the repository ships (data/): every file the benchmarks read by default is there,
byte for byte the copy data/README.md describes (its sha256 prefix and record count), so a clone with
nothing beside it runs its benchmarks and tests."""
import gzip
import hashlib
import sys
import json
import re
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "data"


def readme_table() -> dict[str, tuple[int, str]]:
    """file -> (records, sha256 prefix) from data/README.md's table rows that name a .jsonl (or .jsonl.gz) file."""
    rows = {}
    for line in (DATA / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0].endswith((".jsonl", ".jsonl.gz")):
            rows[cells[0]] = (int(cells[3]), cells[5])
    return rows


def test_readme_lists_every_dataset_the_benchmarks_name():
    from project.evaluation.data import DATASETS, DEFAULT_DATA_DIR

    assert DEFAULT_DATA_DIR == DATA
    local = {spec.local for spec in DATASETS.values() if spec.local}
    assert local and local <= set(readme_table())


@pytest.mark.parametrize("rel", sorted(readme_table()))
def test_data_file_matches_its_provenance(rel):
    records, sha_prefix = readme_table()[rel]
    raw = (DATA / rel).read_bytes()
    if rel.endswith(".gz"):  # shipped compressed; the sha256 is the source file's, of the decompressed bytes
        raw = gzip.decompress(raw)
    assert re.fullmatch(r"[0-9a-f]{16}", sha_prefix)
    assert hashlib.sha256(raw).hexdigest().startswith(sha_prefix)
    assert sum(1 for line in raw.decode().splitlines() if line.strip() and json.loads(line)) == records


def test_a_changed_byte_is_caught(tmp_path, monkeypatch):
    """The check reads the bytes: one byte changed in a copy of GSM8K fails it."""
    copy = tmp_path / "gsm8k"
    copy.mkdir()
    raw = bytearray((DATA / "gsm8k/test.jsonl").read_bytes())
    raw[100] ^= 1
    (copy / "test.jsonl").write_bytes(bytes(raw))
    (tmp_path / "README.md").write_bytes((DATA / "README.md").read_bytes())
    monkeypatch.setattr(sys.modules[__name__], "DATA", tmp_path)
    with pytest.raises(AssertionError):
        test_data_file_matches_its_provenance("gsm8k/test.jsonl")


def test_the_gzipped_train_split_reads_as_its_source_with_the_same_problem_ids():
    """data/gsm8k/train.jsonl.gz reads row for row like the plain file, and its problems keep the ids
    `train-<row>` that the target-written answers in data/gsm8k/generated/ refer to."""
    from project.evaluation.data import data_stem, load_problems, read_json_rows

    gz = DATA / "gsm8k" / "train.jsonl.gz"
    rows = read_json_rows(gz)
    assert rows == [json.loads(line) for line in gzip.decompress(gz.read_bytes()).decode().splitlines() if line.strip()]
    assert data_stem(gz) == data_stem("train.jsonl") == "train" and data_stem("math500.json") == "math500"
    problems = load_problems(data_file=gz)
    assert problems[120].id == "train-120" and problems[120].question == rows[120]["question"]
    gen = json.loads((DATA / "gsm8k" / "generated" / "train_120-852_coder1.5b_greedy.jsonl").read_text().splitlines()[0])
    assert gen["id"] == "train-120"


def _fold(text: str) -> str:
    return " ".join(text.lower().split())


def test_the_self_written_training_text_holds_no_evaluation_question_and_none_twice():
    """data/selfmath's problems and answers (training text the target wrote) against the evaluation files read
    directly: no question of GSM8K test, MATH-500, AIME or AMC (whitespace and case folded), every answer's question
    one of its round's usable problems, and no question answered twice across the files (the rounds' READMEs say
    repeats were dropped)."""
    evaluation = set()
    for f in [DATA / "gsm8k" / "test.jsonl", *sorted((DATA / "limo" / "eval").glob("*.jsonl"))]:
        for line in f.read_text().splitlines():
            row = json.loads(line)
            evaluation.add(_fold(row.get("question") or row.get("problem")))
    assert len(evaluation) > 1800  # GSM8K test's 1,319 and MATH-500's 500 at least
    problems = {_fold(json.loads(line)["question"]) for f in (DATA / "selfmath").glob("problems*.jsonl")
                for line in f.read_text().splitlines() if json.loads(line)["question"]}
    answered = [_fold(json.loads(line)["question"]) for f in sorted((DATA / "selfmath").glob("answers*.jsonl"))
                for line in f.read_text().splitlines()]
    assert len(answered) > 3000 and len(set(answered)) == len(answered)
    assert set(answered) <= problems
    assert not problems & evaluation, sorted(problems & evaluation)[:3]


def _evaluation_questions() -> set[str]:
    """Every evaluation question the repository ships, folded: GSM8K test, MATH-500, AIME, AMC, each Spec-Bench turn."""
    out = set()
    for f in [DATA / "gsm8k" / "test.jsonl", *sorted((DATA / "limo" / "eval").glob("*.jsonl"))]:
        for line in f.read_text().splitlines():
            row = json.loads(line)
            out.add(_fold(row.get("question") or row.get("problem")))
    for line in (DATA / "spec_bench" / "question.jsonl").read_text().splitlines():
        out.update(_fold(t) for t in json.loads(line)["turns"])
    return out


def test_the_general_training_text_holds_no_evaluation_question():
    """data/chat's and data/texts' requests and every user turn of their answers (the general text a draft head
    trains on) against the evaluation files read directly; each answer answers a kept request of its folder."""
    evaluation = _evaluation_questions()
    assert len(evaluation) > 2300  # GSM8K test's 1,319, MATH-500's 500, Spec-Bench's 480 questions' turns at least
    for folder, least in (("chat", 10000), ("texts", 4000)):
        _check_general_text(DATA / folder, evaluation, least)


def _check_general_text(folder, evaluation: set[str], least: int) -> None:
    """One folder of general text: its kept requests and its answers' user turns hold no evaluation question."""
    requests, users = set(), []
    for f in sorted(folder.glob("requests_*.jsonl.gz")):
        requests |= {_fold(r["question"]) for r in map(json.loads, gzip.open(f, "rt")) if r["question"]}
    for f in sorted(folder.glob("answers_*.jsonl.gz")):
        for r in map(json.loads, gzip.open(f, "rt")):
            turns = [m["content"] for m in r["messages"] if m["role"] == "user"]
            assert _fold(turns[0]) == _fold(r["question"]) and _fold(r["question"]) in requests
            users += [_fold(t) for t in turns]
    assert len(users) > least, (folder, len(users))
    assert not set(users) & evaluation, sorted(set(users) & evaluation)[:3]
    assert not requests & evaluation
