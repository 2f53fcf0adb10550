"""project/write_problems.py: what is kept of a problem the target wrote, the items' spread over MATH's subjects,
and both steps end to end on a tiny random target (records, resume, one-line errors)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
from project import write_problems as wp
from project.evaluation.data import build_prompt  # noqa: E402
from test_models_util import hf_qwen2, save_hf, tiny_bpe  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("raw, kept", [
    ("Find all real $x$ such that $x^2 = 4$.", "Find all real $x$ such that $x^2 = 4$."),
    ("**Problem:** Find all real $x$ such that $x^2 = 4$.", "Find all real $x$ such that $x^2 = 4$."),
    ("Problem: Find all real $x$ such that $x^2 = 4$.\n\nSolution: $x = \\pm 2$.",
     "Find all real $x$ such that $x^2 = 4$."),
    ("### Problem Statement\nHow many divisors does $360$ have?\n\n**Answer:** 24",
     "How many divisors does $360$ have?"),
    ("New Math Problem (Level 3):\nHow many divisors does $360$ have?<|im_end|>", "How many divisors does $360$ have?"),
    ("Let $a$ and $b$ be roots of $x^2-5x+6$.\nThe problem is to find $a^2+b^2$.\nHint: use Vieta.",
     "Let $a$ and $b$ be roots of $x^2-5x+6$.\nThe problem is to find $a^2+b^2$."),
])
def test_the_problem_statement_is_kept_without_label_or_solution(raw, kept):
    assert wp.clean_problem(raw) == kept


def test_too_short_or_too_long_is_not_a_problem():
    assert wp.clean_problem("Problem: $x$?") is None
    assert wp.clean_problem("**Solution:** it is 4") is None  # nothing before the solution
    assert wp.clean_problem("Find $x$. " * 200) is None


def test_items_cover_every_subject_topic_and_level_once_a_cycle():
    combos = wp.combinations()
    every = {(s, t, lv) for s, ts in wp.SUBJECTS.items() for t in ts for lv in wp.LEVELS}
    assert len(combos) == len(every) and set(combos) == every
    items = list(wp.problem_items(len(combos) + 3))
    assert [i for i, _ in items[:3]] == ["self-0", "self-1", "self-2"]
    assert items[len(combos)][1]["subject"] == items[0][1]["subject"]  # the cycle starts again
    assert len({f["subject"] for _, f in items[:60]}) == len(wp.SUBJECTS)  # a short run spreads over all
    later = list(wp.problem_items(2, start=5))  # a later run after an earlier file's items: new ids, the same order
    assert later == items[5:7]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("write_problems")
    save_hf(hf_qwen2(seed=0, max_position_embeddings=1024), root / "t", tiny_bpe())
    return root


def _run(tiny: Path, *argv: str) -> None:
    assert wp.main([*argv, "--target", str(tiny / "t"), "--drafter", "ngram", "--no-progress"]) == 0


def test_problems_then_answers_end_to_end_and_resume(tiny, tmp_path):
    problems = tmp_path / "p.jsonl"
    _run(tiny, "problems", "--n", "2", "-o", str(problems), "--max-new-tokens", "8")
    _run(tiny, "problems", "--n", "3", "-o", str(problems), "--max-new-tokens", "8", "--resume")
    rows = [json.loads(x) for x in problems.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["self-0", "self-1", "self-2"]  # the resumed run wrote only the third
    assert all(r["subject"] in wp.SUBJECTS and 1 <= r["level"] <= 5 and r["seed"] == r["index"] for r in rows)
    # a random tiny model writes no usable problem: each is kept with its raw text and no question
    assert all(r["question"] is None and isinstance(r["raw"], str) for r in rows)
    rows[1]["question"] = "What is $1+2$?"  # a problem as a working target writes it
    problems.write_text("".join(json.dumps(r) + "\n" for r in rows))
    answers = tmp_path / "a.jsonl"
    _run(tiny, "answers", str(problems), "-o", str(answers), "--max-new-tokens", "6")
    recs = [json.loads(x) for x in answers.read_text().splitlines()]
    assert [r["id"] for r in recs] == ["self-1"] and recs[0]["question"] == "What is $1+2$?"
    assert recs[0]["mode"] == "spec" and recs[0]["generated_tokens"] <= 6
    # the answer is the target's greedy text under the benchmark's prompt
    from minitorch.generation import SamplingConfig, generate
    from minitorch.models import load_model

    model, tok = load_model(tiny / "t", progress=False)
    want = generate(model, tok.encode(build_prompt(tok, "What is $1+2$?")), 6, SamplingConfig(),
                    sorted(tok.stop_token_ids))
    assert recs[0]["text"] == tok.decode(list(want.tokens))


def test_an_existing_output_without_resume_is_one_line_exit_2(tiny, tmp_path, capsys):
    out = tmp_path / "p.jsonl"
    out.write_text('{"id": "self-0"}\n')
    with pytest.raises(SystemExit) as e:
        wp.run_cli(lambda: wp.main(["problems", "--n", "1", "-o", str(out), "--target", str(tiny / "t")]))
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--resume" in err[0], err


# ----------------------------------------------------------------------------- --batch N (the target alone, issue 42)

def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _alone(tiny: Path, prompt: list[int], n: int, cfg) -> list[int]:
    """What the target alone writes for one prompt (generate, as the engine calls it)."""
    from minitorch.generation import generate
    from minitorch.models import load_model

    model, tok = load_model(tiny / "t", progress=False)
    vocab = min(int(model.config.vocab_size), int(tok.vocab_size))
    return list(generate(model, prompt, n, cfg, sorted(tok.stop_token_ids), vocab_size=vocab).tokens)


def test_batch_writes_what_the_target_alone_writes_and_resumes_after_an_interruption(tiny, tmp_path, monkeypatch):
    """problems --batch 2 (sampled, each item its own seed): every item once, each text the target alone's for that
    item's prompt and seed. Interrupted after 2 finished items, the file keeps those 2; --resume writes exactly the
    others (by id: the lines are in finishing order), and the texts equal the uninterrupted run's."""
    from minitorch.generation import SamplingConfig
    from minitorch.models import load_model
    from project.training import writer

    def run(out: Path, *extra: str) -> None:
        assert wp.main(["problems", "--n", "5", "-o", str(out), "--max-new-tokens", "8", "--batch", "2",
                        "--target", str(tiny / "t"), "--no-progress", *extra]) == 0

    full = tmp_path / "full.jsonl"
    run(full)
    rows = _rows(full)
    assert sorted(r["id"] for r in rows) == [f"self-{i}" for i in range(5)]
    _, tok = load_model(tiny / "t", progress=False)
    for r in rows:  # each text is the target alone's for the item's own prompt and seed
        prompt = wp.problem_prompt(tok, r["subject"], r["topic"], r["level"])
        want = _alone(tiny, prompt, 8, SamplingConfig(temperature=0.8, top_p=0.95, seed=r["index"]))
        assert r["raw"] == tok.decode(want) and r["generated_tokens"] == len(want)

    real = writer.run_jobs

    def interrupted(jobs, batch):
        for k, done in enumerate(real(jobs, batch)):
            if k == 2:
                raise KeyboardInterrupt
            yield done

    part = tmp_path / "part.jsonl"
    monkeypatch.setattr(writer, "run_jobs", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(part)
    assert len(_rows(part)) == 2
    monkeypatch.setattr(writer, "run_jobs", real)
    run(part, "--resume")
    resumed = _rows(part)
    assert sorted(r["id"] for r in resumed) == [f"self-{i}" for i in range(5)]  # every item exactly once
    by_id = {r["id"]: r for r in rows}
    assert all(r["raw"] == by_id[r["id"]]["raw"] and r["seed"] == by_id[r["id"]]["seed"] for r in resumed)


def test_answers_in_a_batch_are_the_target_alones_greedy_text(tiny, tmp_path):
    problems = tmp_path / "p.jsonl"
    questions = ["What is $1+2$?", "Find $x$ if $2x = 6$.", "How many primes are below 10?"]
    problems.write_text("".join(json.dumps({"id": f"self-{i}", "question": q, "subject": "Algebra", "level": 1})
                                + "\n" for i, q in enumerate(questions)))
    answers = tmp_path / "a.jsonl"
    assert wp.main(["answers", str(problems), "-o", str(answers), "--max-new-tokens", "6", "--batch", "2",
                    "--target", str(tiny / "t"), "--no-progress"]) == 0
    from minitorch.generation import SamplingConfig
    from minitorch.models import load_model

    _, tok = load_model(tiny / "t", progress=False)
    recs = {r["question"]: r for r in _rows(answers)}
    assert set(recs) == set(questions)
    for q in questions:
        want = _alone(tiny, tok.encode(build_prompt(tok, q)), 6, SamplingConfig())
        assert recs[q]["text"] == tok.decode(want) and recs[q]["mode"] == "target"


@pytest.mark.parametrize("flags, named", [(["--drafter", "ngram"], "--drafter ngram"), (["--gamma", "3"], "--gamma"),
                                          (["--batch", "0"], None)])
def test_batch_with_speculative_flags_is_one_line_exit_2(tiny, tmp_path, capsys, flags, named):
    argv = ["problems", "--n", "1", "-o", str(tmp_path / "p.jsonl"), "--target", str(tiny / "t")]
    argv += flags if "--batch" in flags else ["--batch", "2", *flags]
    with pytest.raises(SystemExit) as e:
        wp.run_cli(lambda: wp.main(argv))
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    assert (named in err[0] and "target alone" in err[0]) if named else "--batch must be >= 1" in err[0]
    assert not (tmp_path / "p.jsonl").exists()
