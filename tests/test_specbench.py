"""Spec-Bench (project/benchmark_specbench.py): the shipped copy, categories, conversations whose second turn sees the
mode's own first answer, the turns' statistics combined as one generation's, the per-category summary, flag errors,
and its questions kept out of training text."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from minitorch.generation.stats import SpecStats
from project.benchmark_specbench import SPEC_BENCH
from project.evaluation.cli import main
from project.evaluation.data import DEFAULT_DATA_DIR, conversation_prompt, load_problems, select_categories
from project.evaluation.engine import engine_generators
from project.evaluation.runner import combine_turns, read_results, run_benchmark
from project.evaluation.summary import format_table, summarize
from test_benchmark_engine import IdTokenizer
from test_benchmarks import CharTokenizer, Result

QUESTIONS = DEFAULT_DATA_DIR / "spec_bench" / "question.jsonl"
CATEGORIES = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
              "translation", "summarization", "qa", "math_reasoning", "rag"]


def test_the_copy_is_spec_bench_byte_for_byte():
    """data/README.md's sha256 of hemingkx/Spec-Bench @ fd2c1cd7 data/spec_bench/question.jsonl."""
    digest = hashlib.sha256(QUESTIONS.read_bytes()).hexdigest()
    assert digest == "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04"
    assert (QUESTIONS.parent / "LICENSE").read_text().startswith("Apache License")


def test_480_questions_in_13_categories_mt_bench_two_turns():
    problems = load_problems("spec_bench")
    rows = [json.loads(line) for line in QUESTIONS.read_text().splitlines()]
    assert len(problems) == len(rows) == 480 and len({p.id for p in problems}) == 480
    assert list(dict.fromkeys(p.category for p in problems)) == CATEGORIES
    for p, row in zip(problems, rows):
        assert p.turns == tuple(row["turns"]) and p.question == row["turns"][0] and not p.graded
        assert len(p.turns) == (2 if row["category"] in CATEGORIES[:8] else 1)
    first10 = select_categories(problems, None, 10)
    assert len(first10) == 130 and all(sum(q.category == c for q in first10) == 10 for c in CATEGORIES)
    assert [p.category for p in select_categories(problems, "qa,rag", 1)] == ["qa", "rag"]


def _spec_stats(rounds) -> SpecStats:
    s = SpecStats()
    for r in rounds:
        s.record_round(*r)
    s.draft_forwards = 3 * len(rounds)
    s.timer.add("draft", 0.001 * len(rounds))
    s.timer.add("verify", 0.004 * len(rounds))
    return s


def test_two_turns_combine_as_one_generation_of_all_their_rounds():
    """combine_turns against an independent reference: one SpecStats that recorded both turns' rounds."""
    turn1 = [(4, 4, 4, 1), (4, 1, 1, 1), (3, 0, 0, 1)]
    turn2 = [(4, 2, 2, 1), (4, 4, 4, 1), (4, 3, 3, 1), (2, 0, 0, 1)]
    a, b, both = _spec_stats(turn1), _spec_stats(turn2), _spec_stats(turn1 + turn2)
    got = combine_turns([a.as_dict(1.0), b.as_dict(2.0)])
    want = both.as_dict(3.0)
    for k in ("new_tokens", "drafted", "accepted", "target_forwards", "draft_forwards", "rounds", "time_total",
              "per_position_judged", "accept_length_hist"):
        assert got[k] == want[k], k
    for k in ("alpha", "tau", "token_acceptance", "mean_gamma", "cost_ratio_c", "predicted_speedup", "tokens_per_s",
              "time_draft", "time_verify"):
        assert got[k] == pytest.approx(want[k]), k
    assert got["per_position_acceptance"] == pytest.approx(want["per_position_acceptance"])
    # a head's looked-up rounds (--draft-lookup) add up over the turns; a turn without the counter adds nothing
    assert combine_turns([{"lookup_rounds": 3}, {"lookup_rounds": 4}])["lookup_rounds"] == 7
    assert "lookup_rounds" not in got
    # the test has power: averaging the turns' rates instead of pooling their counts is not the same
    assert np.mean([a.as_dict(1.0)["alpha"], b.as_dict(2.0)["alpha"]]) != pytest.approx(want["alpha"])


class ConversationEngine:
    """Records every prompt it is given; answers "answer <n>" with n the number of prompts seen so far."""

    def __init__(self) -> None:
        self.tok = CharTokenizer()
        self.prompts: list[tuple[str, str]] = []

    def generator(self, mode: str):
        def gen(ids, max_new_tokens, seed):
            self.prompts.append((mode, self.tok.decode(ids)))
            tokens = self.tok.encode(f"answer {len(self.prompts)}")[:max_new_tokens]
            stats = {"drafted": 4, "accepted": 2, "new_tokens": len(tokens), "target_forwards": 2, "rounds": 2,
                     "alpha": 0.5, "tau": len(tokens) / 2} if mode == "spec" else {}
            return Result(tokens + [0], "stop", stats)
        return gen

    def factory(self, args, modes):
        from project.evaluation.engine import Engine

        return Engine(tokenizer=self.tok, modes={m: self.generator(m) for m in modes},
                      config={"target": "fake", "seed": args.seed})


def test_second_turn_sees_the_modes_own_first_answer(tmp_path, capsys):
    eng = ConversationEngine()
    out = tmp_path / "sb.jsonl"
    argv = ["--category", "writing,translation", "--per-category", "1", "-o", str(out), "--no-progress", "--no-plots"]
    assert main(SPEC_BENCH, argv, engine_factory=eng.factory) == 0
    recs = read_results(out)
    assert [(r["category"], r["mode"]) for r in recs] == [("writing", "spec"), ("writing", "target"),
                                                          ("translation", "spec"), ("translation", "target")]
    writing = load_problems("spec_bench")[0]
    # spec: turn 1 (prompt 1), turn 2 sees "answer 1"; target: turn 1 (prompt 3), turn 2 sees "answer 3"
    (m1, p1), (m2, p2), (m3, p3), (m4, p4) = eng.prompts[:4]
    assert (m1, m2, m3, m4) == ("spec", "spec", "target", "target")
    assert p1 == conversation_prompt(eng.tok, writing.turns, [])
    assert p2 == conversation_prompt(eng.tok, writing.turns, ["answer 1"]) and writing.turns[1] in p2
    assert p4 == conversation_prompt(eng.tok, writing.turns, ["answer 3"])
    spec = recs[0]
    assert [t["text"] for t in spec["turns"]] == ["answer 1", "answer 2"] and spec["text"] == "answer 1\n\nanswer 2"
    assert spec["generated_tokens"] == 2 * len("answer 1") + 2 and spec["stats"]["drafted"] == 8
    assert spec["correct"] is None and spec["extraction"] == "none" and "Please reason" not in spec["prompt"]
    assert "turns" not in recs[2]  # one turn: a plain generation
    table = capsys.readouterr().out
    assert "writing" in table and "translation" in table and "category" in table


def test_the_real_engine_runs_conversations_and_the_summary_has_categories(tmp_path):
    """The minitorch engine (CPU, a fake target and draft) over two conversations and one single turn: greedy
    speculative output equals the target alone's turn by turn; the summary gives each category's speedup."""
    from minitorch.generation import SamplingConfig
    from minitorch.generation.engine import DrafterSpec, make_engine
    from test_generation_fakes import FakeModel

    tok = IdTokenizer()
    target = FakeModel(len(tok.ALPHABET), seed=1)
    draft = FakeModel(len(tok.ALPHABET), seed=2, like=target, noise=0.3)
    modes = engine_generators(make_engine(target, DrafterSpec("model", model=draft, gamma=3), SamplingConfig()))
    problems = select_categories(load_problems("spec_bench"), "writing,math,qa", 1)
    out = tmp_path / "r.jsonl"
    run_benchmark(problems, modes, tok, out, {"t": 0}, 24, progress=False)
    recs = read_results(out)
    by = {(r["category"], r["mode"]): r for r in recs}
    for cat, turns in (("writing", 2), ("math", 2), ("qa", 1)):
        spec, plain = by[(cat, "spec")], by[(cat, "target")]
        assert spec["text"] == plain["text"] and len(spec.get("turns", [None])) == turns
        st = spec["stats"]
        # each turn's prefill gives its first token, in no round
        assert st["prefill_tokens"] + sum(st["round_emitted"]) == spec["generated_tokens"] == st["new_tokens"]
        assert st["drafted"] == sum(st["round_drafted"]) and st["rounds"] == len(st["round_drafted"])
    s = summarize(recs, n_boot=50)
    assert list(s["categories"]) == ["writing", "math", "qa"] and s["modes"]["spec"]["accuracy"] is None
    assert s["categories"]["math"]["comparisons"][0]["n_pairs"] == 1
    assert s["categories"]["qa"]["modes"]["spec"]["tau"] > 1.0
    assert any(line.startswith("writing") for line in format_table(s).splitlines())


@pytest.mark.parametrize("argv, message", [
    (["--category", "poetry"], "--category 'poetry': choose among writing"),
    (["--per-category", "0"], "--per-category must be >= 1"),
])
def test_bad_category_flags_are_one_line(tmp_path, capsys, argv, message):
    rc = main(SPEC_BENCH, argv + ["-o", str(tmp_path / "r.jsonl"), "--no-progress"],
              engine_factory=ConversationEngine().factory)
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and message in err


def test_spec_bench_turns_are_evaluation_questions():
    """No Spec-Bench turn may enter a head's training text (training/data.py refuses evaluation questions)."""
    from project.training.data import evaluation_questions, is_evaluation_question

    evaluation_questions.cache_clear()
    problems = load_problems("spec_bench")
    assert all(is_evaluation_question(t) for p in problems[:90] for t in p.turns)
    assert is_evaluation_question("  " + problems[5].turns[1].upper() + " ")  # folded as the check folds
    assert not is_evaluation_question("Write a haiku about a teapot.")
