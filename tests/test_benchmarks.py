"""GSM8K / LIMO benchmark programs (project/evaluation/, benchmark_*.py) with fake generators:
well-formed JSONL, resume, shards + merge, interruption (Ctrl-C, SIGTERM, SIGKILL), summary, plots."""
from __future__ import annotations

import gzip
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from project.benchmark_gsm8k import GSM8K
from project.benchmark_limo import LIMO
from project.evaluation.runner import VOLATILE_FIELDS, read_results
from project.evaluation.cli import main
from project.evaluation.data import DEFAULT_DATA_DIR
from project.evaluation.engine import Engine

ROOT = Path(__file__).resolve().parents[1]
RECORD_FIELDS = {
    "id": str, "index": int, "mode": str, "prompt": str, "prompt_tokens": int, "generated_tokens": int,
    "text": str, "gold": str, "extraction": str, "correct": bool, "stop_reason": str, "truncated": bool,
    "time_s": float, "tokens_per_s": float, "stats": dict, "config": dict, "shard": str,
}
PROBLEMS = [
    {"question": "Janet has 16 eggs and eats 3. How many are left?", "answer": "16 - 3 = 13\n#### 13"},
    {"question": "A robe takes 2 bolts of blue and half that of white. Total?", "answer": "#### 3"},
    {"question": "Josh buys a house for $80,000 ... profit?", "answer": "#### 70,000"},
    {"question": "James runs 3 sprints 3 times a week, 60 m each. Meters a week?", "answer": "#### 540"},
    {"question": "Every day Wendi feeds each chicken 3 cups. Cups in the final meal?", "answer": "#### 20"},
]


class CharTokenizer:
    """One token per character (id = code point); id 0 is the stop token."""

    stop_token_ids = {0}

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids) -> str:
        return "".join(chr(i) for i in ids if i != 0)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        body = "".join(f"<|{m['role']}|>{m['content']}" for m in messages)
        return body + ("<|assistant|>" if add_generation_prompt else "")


@dataclass
class Result:
    tokens: list[int]
    stop_reason: str
    stats: dict = field(default_factory=dict)


class FakeEngine:
    """Answers each question by lookup; "spec" reports acceptance stats. The output depends on the
    seed (so shards must seed problems like one run), and problem `wrong` gets a wrong answer."""

    def __init__(self, problems=PROBLEMS, interrupt_at: int | None = None, sleep_at: int | None = None,
                 wrong: int = 1, error_at: int | None = None) -> None:
        self.answers = {p["question"]: p["answer"].split("####")[-1].strip() for p in problems}
        self.order = [p["question"] for p in problems]
        self.interrupt_at, self.sleep_at, self.wrong, self.error_at = interrupt_at, sleep_at, wrong, error_at
        self.calls: list[tuple[str, str]] = []
        self.tok = CharTokenizer()

    def _question(self, ids: list[int]) -> str:
        prompt = self.tok.decode(ids)
        return next(q for q in self.answers if q in prompt)

    def generator(self, mode: str):
        def gen(ids: list[int], max_new_tokens: int, seed: int) -> Result:
            q = self._question(ids)
            k = self.order.index(q)
            if k == self.interrupt_at:
                raise KeyboardInterrupt
            if k == self.sleep_at:
                time.sleep(60)
            if k == self.error_at:
                raise ValueError("prompt (300 tokens) + max_new_tokens (1024) exceeds the model's context")
            self.calls.append((q, mode))
            ans = self.answers[q] if k != self.wrong else "999"
            rng = np.random.default_rng(seed)
            text = f"Think {int(rng.integers(0, 1000))}. So \\boxed{{{ans}}}"
            tokens = self.tok.encode(text)[:max_new_tokens]
            stop = "length" if len(tokens) == max_new_tokens else "stop"
            if stop == "stop":
                tokens.append(0)
            stats: dict[str, Any] = {}
            if mode == "spec":
                rounds = (len(tokens) + 2) // 3
                stats = {"drafted": 4 * rounds, "accepted": 2 * rounds, "alpha": 0.5, "tau": len(tokens) / rounds,
                         "new_tokens": len(tokens), "target_forwards": rounds,
                         "per_position_acceptance": [0.8, 0.6, 0.4, 0.2], "per_position_judged": [rounds, 8, 5, 2],
                         "predicted_speedup": 1.5, "round_drafted": [4] * rounds,
                         "round_accepted": [3 if i < rounds // 3 else 1 for i in range(rounds)]}
            time.sleep(0.002 if mode == "spec" else 0.004)
            return Result(tokens, stop, stats)
        return gen

    def factory(self, args, modes) -> Engine:
        return Engine(tokenizer=self.tok, modes={m: self.generator(m) for m in modes},
                      config={"target": "fake", "drafter": "model", "gamma": 4, "seed": args.seed})


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS))
    return path


def run(argv: list[str], engine: FakeEngine, bench=GSM8K) -> int:
    return main(bench, argv + ["--no-progress"], engine_factory=engine.factory)


def strip_volatile(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in VOLATILE_FIELDS} for r in records]


# ----------------------------------------------------------------------------- run, resume, errors

def test_three_problem_run_writes_wellformed_jsonl(tmp_path, data_file, capsys):
    out = tmp_path / "r.jsonl"
    assert run(["--data-file", str(data_file), "--limit", "3", "-o", str(out)], FakeEngine()) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 6  # 3 problems x (spec, target)
    recs = [json.loads(line) for line in lines]
    for r in recs:
        for name, typ in RECORD_FIELDS.items():
            assert isinstance(r[name], typ), (name, r[name])
        assert r["prompt"].startswith("<|user|>") and "\\boxed{}" in r["prompt"]
        assert r["prompt_tokens"] == len(r["prompt"])
        assert r["generated_tokens"] == len(r["text"]) + 1  # the stop token is not in the text
        assert r["extraction"] == "boxed" and r["stop_reason"] == "stop" and not r["truncated"]
    assert [(r["index"], r["mode"]) for r in recs] == [(i, m) for i in range(3) for m in ("spec", "target")]
    assert [r["correct"] for r in recs] == [True, True, False, False, True, True]  # problem 1 answered wrong
    assert recs[4]["gold"] == "70000" and recs[4]["extracted"] == "70000"
    spec = recs[0]
    assert spec["alpha"] == 0.5 and spec["per_position_acceptance"] == [0.8, 0.6, 0.4, 0.2]
    assert spec["output_acceptance"][0] == 0.75 and spec["output_acceptance"][2] == 0.25
    assert recs[1]["alpha"] is None and recs[1]["tau"] is None
    summary = json.loads((tmp_path / "r.summary.json").read_text())
    assert summary["modes"]["spec"]["accuracy"] == pytest.approx(2 / 3)
    assert summary["comparisons"][0]["n_pairs"] == 3
    assert sorted(p.name for p in (tmp_path / "r_plots").iterdir()) == [
        "acceptance.png", "speedup.png", "throughput_latency.png"]
    printed = capsys.readouterr().out
    assert "speedup spec / target" in printed and "acceptance by draft position" in printed


def test_resume_redoes_nothing_and_continues(tmp_path, data_file):
    out = tmp_path / "r.jsonl"
    assert run(["--data-file", str(data_file), "--limit", "3", "-o", str(out), "--no-plots"], FakeEngine()) == 0
    before = out.read_bytes()
    again = FakeEngine()
    assert run(["--data-file", str(data_file), "--limit", "3", "-o", str(out), "--resume", "--no-plots"], again) == 0
    assert again.calls == [] and out.read_bytes() == before
    more = FakeEngine()
    assert run(["--data-file", str(data_file), "--limit", "5", "-o", str(out), "--resume", "--no-plots"], more) == 0
    assert [q for q, _ in more.calls] == [PROBLEMS[3]["question"]] * 2 + [PROBLEMS[4]["question"]] * 2
    assert out.read_bytes().startswith(before) and len(read_results(out)) == 10


def test_existing_output_without_resume_is_one_line_error(tmp_path, data_file, capsys):
    out = tmp_path / "r.jsonl"
    assert run(["--data-file", str(data_file), "--limit", "1", "-o", str(out), "--no-plots"], FakeEngine()) == 0
    capsys.readouterr()
    engine = FakeEngine()
    assert run(["--data-file", str(data_file), "--limit", "1", "-o", str(out)], engine) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--resume" in err and engine.calls == []


def test_summary_command_and_json_list_data_file(tmp_path, capsys):
    data = tmp_path / "problems.json"
    data.write_text(json.dumps([{"id": 7, "problem": PROBLEMS[0]["question"], "answer": 13.0}]))
    out = tmp_path / "r.jsonl"
    assert run(["--data-file", str(data), "-o", str(out), "--no-plots"], FakeEngine()) == 0
    assert read_results(out)[0]["id"] == "problems-7" and read_results(out)[0]["correct"]
    (tmp_path / "r.summary.json").unlink()
    capsys.readouterr()
    assert main(GSM8K, ["summary", str(out), "--no-plots"]) == 0
    assert "spec" in capsys.readouterr().out and (tmp_path / "r.summary.json").is_file()
    # a finished run kept compressed (docs/results/): its summary where the uncompressed run's goes, not r.jsonl.*
    (tmp_path / "r.summary.json").unlink()
    packed = tmp_path / "r.jsonl.gz"
    packed.write_bytes(gzip.compress(out.read_bytes()))
    out.unlink()
    assert main(GSM8K, ["summary", str(packed), "--no-plots"]) == 0
    assert (tmp_path / "r.summary.json").is_file() and not (tmp_path / "r.jsonl.summary.json").exists()


def test_resume_with_other_settings_is_refused(tmp_path, data_file, capsys):
    out = tmp_path / "r.jsonl"
    assert run(["--data-file", str(data_file), "--limit", "1", "-o", str(out), "--no-plots"], FakeEngine()) == 0
    rc = run(["--data-file", str(data_file), "--limit", "2", "-o", str(out), "--resume", "--max-new-tokens", "7"],
             FakeEngine())
    assert rc == 2 and "different settings" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--modes", "spec,fast"], "--modes"),
    (["--shard", "2/2"], "--shard"),
    (["--shard", "x"], "--shard"),
    (["--limit", "0"], "--limit"),
    (["--offset", "99"], "--offset"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--ray", "--ray-workers", "0"], "--ray-workers must be >= 1"),  # it sat at 0% for minutes before
    (["--ray", "--ray-cpus-per-worker", "-1"], "--ray-cpus-per-worker must be >= 1"),
    (["--ray-workers", "2"], "add --ray"),
    (["--batch", "2", "--modes", "spec,target"], "--modes target"),
    (["--batch", "2", "--compare-hf"], "not with --compare-hf"),
    (["--batch", "2", "--ray"], "not with --ray"),
    (["--batch", "2"], "one sequence at a time"),  # an engine without a batch (FakeEngine's)
])
def test_bad_flags_exit_2_with_one_line(tmp_path, data_file, capsys, argv, message):
    rc = run(["--data-file", str(data_file), "-o", str(tmp_path / "r.jsonl")] + argv, FakeEngine())
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and message in err and "Traceback" not in err


@pytest.mark.parametrize("argv, message", [
    (["--gamma", "0"], "--gamma"),
    (["--draft-extend", "2", "--drafter", "ngram"], "--drafter model"),
    (["--head", "somewhere", "--drafter", "model"], "--head"),
    (["--top-p", "0"], "top_p"),
    (["--dtype", "bfloat16"], "--backend cuda"),
    (["--batch", "0"], "--batch must be >= 1"),
    (["--batch", "4", "--drafter", "head"], "--batch 4 decodes the target alone"),
    (["--batch", "4", "--draft-vocab", "100"], "--draft-vocab is for speculative decoding"),
])
def test_engine_flags_are_checked_before_anything_loads(tmp_path, data_file, capsys, monkeypatch, argv, message):
    """The real engine path (no factory): settings.resolve_settings refuses a bad value before the problems or
    the models load (loading is made to fail loudly here)."""
    from project.evaluation import cli

    def no_load(*a, **k):
        raise AssertionError("models loaded before the flags were checked")

    monkeypatch.setattr(cli, "load_engine", no_load)
    rc = main(GSM8K, ["--data-file", str(data_file), "-o", str(tmp_path / "r.jsonl"), "--no-progress"] + argv)
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and message in err and "Traceback" not in err


def test_missing_and_corrupt_data_files(tmp_path, capsys):
    assert run(["--data-file", str(tmp_path / "nope.jsonl")], FakeEngine()) == 2
    assert "not found" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "1"}\n{oops\n')
    assert run(["--data-file", str(bad)], FakeEngine()) == 2
    assert "bad.jsonl:2" in capsys.readouterr().err
    noq = tmp_path / "noq.jsonl"
    noq.write_text('{"text": "q", "answer": "1"}\n')
    assert run(["--data-file", str(noq)], FakeEngine()) == 2
    assert "no question field" in capsys.readouterr().err


def test_generation_error_names_the_problem_and_keeps_results(tmp_path, data_file, capsys):
    out = tmp_path / "r.jsonl"
    assert run(["--data-file", str(data_file), "--limit", "3", "-o", str(out)], FakeEngine(error_at=2)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "problems-2 (spec)" in err and "context" in err
    assert len(read_results(out)) == 4


def test_truncation_is_counted(tmp_path, data_file):
    out = tmp_path / "r.jsonl"
    assert run(["--data-file", str(data_file), "--limit", "2", "-o", str(out), "--max-new-tokens", "8",
                "--modes", "target", "--no-plots"], FakeEngine()) == 0
    recs = read_results(out)
    assert all(r["truncated"] and r["stop_reason"] == "length" and r["generated_tokens"] == 8 for r in recs)
    summary = json.loads((tmp_path / "r.summary.json").read_text())
    assert summary["modes"]["target"]["truncated"] == 2 and list(summary["modes"]) == ["target"]


# ----------------------------------------------------------------------------- shards and merge

def test_shards_merge_into_the_same_result_as_one_run(tmp_path, data_file):
    whole = tmp_path / "whole.jsonl"
    assert run(["--data-file", str(data_file), "-o", str(whole), "--no-plots", "--seed", "7"], FakeEngine()) == 0
    shards = []
    for i in (1, 0, 2):  # any order
        path = tmp_path / f"s{i}.jsonl"
        assert run(["--data-file", str(data_file), "-o", str(path), "--shard", f"{i}/3", "--no-plots",
                    "--seed", "7"], FakeEngine()) == 0
        shards.append(path)
    assert [len(read_results(p)) for p in shards] == [4, 4, 2]  # problems {1,4}, {0,3}, {2} x 2 modes
    merged = tmp_path / "merged.jsonl"
    assert main(GSM8K, ["merge", "-o", str(merged), "--no-plots", *map(str, shards)]) == 0
    assert strip_volatile(read_results(merged)) == strip_volatile(read_results(whole))
    s_whole = json.loads((tmp_path / "whole.summary.json").read_text())
    s_merged = json.loads((tmp_path / "merged.summary.json").read_text())
    for mode in ("spec", "target"):
        for key in ("n", "correct", "accuracy", "truncated", "extraction", "alpha", "per_position_acceptance"):
            assert s_merged["modes"][mode].get(key) == s_whole["modes"][mode].get(key)


def test_merge_refuses_mixed_settings_and_dedupes(tmp_path, data_file, capsys):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert run(["--data-file", str(data_file), "--limit", "2", "-o", str(a), "--no-plots"], FakeEngine()) == 0
    assert run(["--data-file", str(data_file), "--limit", "2", "-o", str(b), "--no-plots", "--seed", "1"],
               FakeEngine()) == 0
    assert main(GSM8K, ["merge", "-o", str(tmp_path / "m.jsonl"), str(a), str(b)]) == 2
    assert "different settings" in capsys.readouterr().err
    assert main(GSM8K, ["merge", "-o", str(tmp_path / "m.jsonl"), "--no-plots", str(a), str(a)]) == 0
    assert len(read_results(tmp_path / "m.jsonl")) == 4
    assert main(GSM8K, ["merge", "-o", str(a), str(a)]) == 2  # never overwrite an input


# ----------------------------------------------------------------------------- interruption

def test_ctrl_c_on_problem_2_keeps_problem_1_then_resume_finishes(tmp_path, data_file, capsys):
    out = tmp_path / "r.jsonl"
    args = ["--data-file", str(data_file), "--limit", "3", "-o", str(out), "--no-plots"]
    assert run(args, FakeEngine(interrupt_at=1)) == 130
    assert "--resume" in capsys.readouterr().err
    assert [(r["index"], r["mode"]) for r in read_results(out)] == [(0, "spec"), (0, "target")]
    finish = FakeEngine()
    assert run(args + ["--resume"], finish) == 0
    assert len(finish.calls) == 4  # problems 2 and 3, both modes; problem 1 not redone
    clean = tmp_path / "clean.jsonl"
    assert run(["--data-file", str(data_file), "--limit", "3", "-o", str(clean), "--no-plots"], FakeEngine()) == 0
    assert strip_volatile(read_results(out)) == strip_volatile(read_results(clean))


def test_cut_off_last_line_is_repaired_on_resume(tmp_path, data_file):
    out = tmp_path / "r.jsonl"
    args = ["--data-file", str(data_file), "--limit", "2", "-o", str(out), "--no-plots"]
    assert run(args, FakeEngine()) == 0
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:2]) + lines[2][:40])  # killed while writing problem 2's first line
    assert len(read_results(out)) == 2
    assert run(args + ["--resume"], FakeEngine()) == 0
    assert [json.loads(line)["index"] for line in out.read_text().splitlines()] == [0, 0, 1, 1]


def _check_resume_after_one_mode(tmp_path, data_file):
    out = tmp_path / "r.jsonl"
    args = ["--data-file", str(data_file), "--limit", "3", "-o", str(out), "--no-plots"]
    assert run(args, FakeEngine()) == 0
    clean = read_results(out)
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:3]))  # problem 1 both modes, problem 2 spec only
    finish = FakeEngine()
    assert run(args + ["--resume"], finish) == 0
    q = [p["question"] for p in PROBLEMS]
    assert finish.calls == [(q[1], "target"), (q[2], "spec"), (q[2], "target")]
    got = read_results(out)
    assert sorted((r["index"], r["mode"]) for r in got) == sorted((r["index"], r["mode"]) for r in clean)
    key = lambda r: (r["index"], r["mode"])  # noqa: E731
    assert strip_volatile(sorted(got, key=key)) == strip_volatile(sorted(clean, key=key))


def test_resume_after_one_mode_of_a_problem_runs_only_the_other(tmp_path, data_file):
    """Killed between the two modes of problem 2: resume runs problem 2's target mode and problem 3, and the
    file then equals a clean run's (volatile fields aside), each (problem, mode) once."""
    _check_resume_after_one_mode(tmp_path, data_file)


def test_resume_check_catches_problems_counted_done_by_id(tmp_path, data_file, monkeypatch):
    """A resume that counts a problem done once any of its modes is recorded fails the check above."""
    from project.evaluation import runner as evaluation

    real = evaluation.read_results

    def by_id(path, repair=False):
        recs = real(path, repair=repair)
        return recs + [dict(r, mode=m) for r in recs for m in ("spec", "target") if m != r["mode"]]

    monkeypatch.setattr(evaluation, "read_results", by_id)
    with pytest.raises(AssertionError):
        _check_resume_after_one_mode(tmp_path, data_file)


def test_foreign_file_as_output_is_refused_not_truncated(tmp_path, data_file, capsys):
    foreign = tmp_path / "data.jsonl"
    foreign.write_text('{"question": "q", "answer": "1"}')  # no trailing newline, like math500.jsonl
    before = foreign.read_bytes()
    assert run(["--data-file", str(data_file), "-o", str(foreign), "--resume"], FakeEngine()) == 2
    assert "not a results record" in capsys.readouterr().err and foreign.read_bytes() == before


CHILD = """
import sys
sys.path[:0] = [{tests!r}, {root!r}]
import test_benchmarks as t
sys.exit(t.run({argv!r}, t.FakeEngine(sleep_at=1)))
"""


@pytest.mark.parametrize("sig, rc", [(signal.SIGTERM, 130), (signal.SIGKILL, -signal.SIGKILL)])
def test_kill_mid_run_keeps_finished_problems(tmp_path, data_file, sig, rc):
    out = tmp_path / "r.jsonl"
    argv = ["--data-file", str(data_file), "--limit", "3", "-o", str(out), "--no-plots"]
    code = CHILD.format(tests=str(ROOT / "tests"), root=str(ROOT), argv=argv)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while len(read_results(out)) < 2 and time.time() < deadline:  # problem 1 done, problem 2 sleeping
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == rc, err
    assert [(r["index"], r["mode"]) for r in read_results(out)] == [(0, "spec"), (0, "target")]
    if sig == signal.SIGTERM:
        assert "interrupted" in err and "Traceback" not in err
    finish = FakeEngine()
    assert run(argv + ["--resume"], finish) == 0 and len(finish.calls) == 4


# ----------------------------------------------------------------------------- LIMO program, data

def test_limo_program_on_amc23_floats(tmp_path):
    rows = [json.loads(line) for line in (DEFAULT_DATA_DIR / "limo/eval/amc23.jsonl").read_text().splitlines()]
    engine = FakeEngine(problems=[{"question": r["problem"], "answer": f"#### {r['answer']}"} for r in rows[:3]],
                        wrong=-1)
    out = tmp_path / "amc.jsonl"
    assert run(["--dataset", "amc23", "--limit", "3", "-o", str(out), "--no-plots", "--system-prompt"],
               engine, bench=LIMO) == 0
    recs = read_results(out)
    assert [r["gold"] for r in recs[::2]] == ["27", "36", "45"]  # stored as 27.0, 36.0, 45.0
    assert all(r["correct"] for r in recs)  # the fake answers "27.0": math-verify equates it with 27
    assert recs[0]["prompt"].startswith("<|system|>Please reason step by step")
    assert recs[0]["config"]["max_new_tokens"] == 4096 and recs[0]["id"] == "amc23-0"


@pytest.mark.parametrize("name, count, first_id", [
    ("gsm8k", 1319, "gsm8k-0"), ("math500", 500, "test/precalculus/807.json"),
    ("aime24", 30, "aime24-60"), ("amc23", 40, "amc23-0"),
])
def test_named_datasets_load_from_the_repositorys_data(name, count, first_id):
    from project.evaluation.data import load_problems

    problems = load_problems(name)
    assert len(problems) == count and problems[0].id == first_id
    assert len({p.id for p in problems}) == count and all(p.question and p.gold for p in problems)


def test_hub_dataset_without_datasets_package_is_a_clear_error():
    from project.evaluation.data import BenchmarkError, load_problems

    try:
        import datasets  # noqa: F401
        pytest.skip("datasets is installed; the hub path would try the network")
    except ImportError:
        pass
    with pytest.raises(BenchmarkError, match="needs the 'datasets' package"):
        load_problems("limo")


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_shards_partition_the_selection(n):
    from project.evaluation.data import Problem, select_problems

    problems = [Problem(f"p{i}", i, "q", "1") for i in range(20)]
    chosen = [p for i in range(n) for p in select_problems(problems, 3, 11, (i, n))]
    assert sorted(p.index for p in chosen) == list(range(3, 14))


def test_cost_model_derives_per_forward_times_from_raw_timers():
    from minitorch.generation.stats import cost_model_speedup
    from minitorch.generation.stats import expected_tokens_per_round
    spec = {"token_acceptance": 0.8, "mean_gamma": 4.0, "rounds": 5, "time_draft": 1.6, "draft_forwards": 20,
            "time_verify": 1.5, "target_forwards": 5}
    base = {"time_verify": 4.0, "target_forwards": 20}
    want = expected_tokens_per_round(0.8, 4.0) * 0.2 / (4 * 0.08 + 0.3)
    assert cost_model_speedup(spec, base) == pytest.approx(want)
    assert cost_model_speedup({"rounds": 5}, base) is None  # a record without acceptance statistics


# ----------------------------------------------------------------------------- --repeats: timing on a drifting machine

def test_median_record_is_the_median_runs_record_whole():
    """The record of median wall time, with its own statistics (not another run's, not a mean of times), every run's
    seconds in the order run, and whether every run wrote the same text."""
    from project.evaluation.runner import median_record

    runs = [{"time_s": t, "text": "a", "stats": {"time_prefill": t / 2}} for t in (5.0, 1.0, 3.0)]
    rec = median_record(runs)
    assert rec["time_s"] == 3.0 and rec["stats"] == {"time_prefill": 1.5}
    assert rec["time_s_runs"] == [5.0, 1.0, 3.0] and rec["repeats_identical"]
    two = median_record([dict(runs[0]), dict(runs[1], text="b")])  # an even count: the lower of the middle two
    assert two["time_s"] == 1.0 and not two["repeats_identical"]
    assert "time_s_runs" not in runs[2]  # the runs' own records untouched


def test_modes_alternate_which_runs_first_and_records_keep_their_order():
    """Problem k's r-th repetition runs spec first when k + r is even, target first when odd; the records come out
    one a (problem, mode), spec then target, each after its problem's repetitions."""
    from project.evaluation.runner import timed_records
    from project.evaluation.data import Problem

    calls, clock = [], iter(range(1, 100))
    problems = [Problem(f"p{i}", i, "q", "1") for i in (4, 7)]

    def run(problem, mode):
        calls.append((problem.index, mode))
        return {"id": problem.id, "mode": mode, "time_s": float(next(clock)), "text": "t"}

    recs = list(timed_records([(p, m) for p in problems for m in ("spec", "target")], run, repeats=3))
    assert calls == [(4, "spec"), (4, "target"), (4, "target"), (4, "spec"), (4, "spec"), (4, "target"),
                     (7, "target"), (7, "spec"), (7, "spec"), (7, "target"), (7, "target"), (7, "spec")]
    assert [(r["id"], r["mode"]) for r in recs] == [("p4", "spec"), ("p4", "target"), ("p7", "spec"), ("p7", "target")]
    assert recs[0]["time_s_runs"] == [1.0, 4.0, 5.0] and recs[0]["time_s"] == 4.0
    calls.clear()
    one = list(timed_records([(p, m) for p in problems for m in ("spec", "target")], run))
    assert calls == [(4, "spec"), (4, "target"), (7, "target"), (7, "spec")]
    assert [r["mode"] for r in one] == ["spec", "target", "spec", "target"] and "time_s_runs" not in one[0]


def test_repeats_run_each_generation_n_times_and_record_it(tmp_path, data_file, capsys):
    out = tmp_path / "r.jsonl"
    engine = FakeEngine()
    args = ["--data-file", str(data_file), "--limit", "2", "-o", str(out), "--no-plots"]
    assert run(args + ["--repeats", "3"], engine) == 0
    assert sorted(engine.calls) == sorted([(p["question"], m) for p in PROBLEMS[:2] for m in ("spec", "target")] * 3)
    recs = read_results(out)
    assert [(r["index"], r["mode"]) for r in recs] == [(0, "spec"), (0, "target"), (1, "spec"), (1, "target")]
    assert all(len(r["time_s_runs"]) == 3 and r["repeats_identical"] and r["config"]["repeats"] == 3 for r in recs)
    assert run(args + ["--resume"], FakeEngine()) == 2  # another --repeats than the file's: refused
    assert "repeats" in capsys.readouterr().err
    assert run(args + ["-o", str(tmp_path / "b.jsonl"), "--repeats", "2", "--batch", "4", "--modes", "target"],
               FakeEngine()) == 2
    assert "--repeats 2" in capsys.readouterr().err
