"""Benchmark summary arithmetic, and the benchmark run loop on the real generation engine
(minitorch.generation) with tiny numpy models (tests/test_generation_fakes.py)."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from project.evaluation.runner import read_results, round_log_stats, thirds_counts
from project.evaluation.data import BenchmarkError, Problem
from project.evaluation.summary import _pool_positions, bootstrap_speedup, format_table, summarize


# ----------------------------------------------------------------------------- summary arithmetic

def test_bootstrap_speedup_point_and_interval():
    ones = np.ones(4)
    point, lo, hi = bootstrap_speedup(10 * ones, ones, 10 * ones, 2 * ones)
    assert (point, lo, hi) == (2.0, 2.0, 2.0)  # every problem exactly 2x: no spread
    tok = np.array([100.0, 100.0, 100.0, 100.0])
    point, lo, hi = bootstrap_speedup(tok, np.array([1.0, 1.0, 2.0, 4.0]), tok, np.array([2.0, 2.0, 2.0, 2.0]))
    assert point == pytest.approx(1.0) and lo < point < hi  # 400 tokens in 8 s both ways; spread
    assert 0.5 <= lo and hi <= 2.0  # bounded by the per-problem extremes


def test_positions_pooled_by_judged_counts():
    recs = [{"per_position_acceptance": [1.0, 0.0], "stats": {"per_position_judged": [10, 1]}},
            {"per_position_acceptance": [0.0, 1.0, 0.5], "stats": {"per_position_judged": [30, 3, 2]}}]
    assert _pool_positions(recs) == pytest.approx([10 / 40, 3 / 4, 0.5])


def test_round_log_and_thirds():
    # gamma 4, limit 12: rounds emit 5, 1, 3, then the last round may draft only 12 - 9 - 1 = 2
    log = round_log_stats([5, 1, 3, 3], gamma=4, max_new_tokens=12, adaptive=False)
    assert log["round_drafted"] == [4, 4, 4, 2] and log["round_accepted"] == [4, 0, 2, 2]
    assert "round_drafted" not in round_log_stats([5, 1], 4, 12, adaptive=True)
    # positions 0, 5, 6, 9 of 12: thirds are [0, 4), [4, 8), [8, 12)
    assert thirds_counts(log) == [[4, 4], [2, 8], [2, 2]]
    assert thirds_counts({"drafted": 3}) is None


def _rec(i, mode, tokens, secs, correct=True, text="t", alpha=None):
    return {"id": f"p{i}", "index": i, "mode": mode, "generated_tokens": tokens, "time_s": secs,
            "tokens_per_s": tokens / secs, "correct": correct, "truncated": False, "extraction": "boxed",
            "text": text, "alpha": alpha, "tau": None, "stats": {}, "config": {"dataset": "d"}}


def test_summary_accuracy_speed_and_table():
    recs = [_rec(0, "spec", 100, 1.0, alpha=0.5), _rec(0, "target", 100, 2.0),
            _rec(1, "spec", 50, 1.0, correct=False, alpha=0.5), _rec(1, "target", 50, 1.0, text="other")]
    s = summarize(recs, n_boot=200)
    assert s["n_problems"] == 2 and list(s["modes"]) == ["spec", "target"]
    assert s["modes"]["spec"]["accuracy"] == 0.5 and s["modes"]["target"]["accuracy"] == 1.0
    assert s["modes"]["spec"]["median_tokens_per_s"] == 75.0
    assert s["modes"]["target"]["aggregate_tokens_per_s"] == 50.0
    comp = s["comparisons"][0]
    assert comp["speedup"] == pytest.approx(75 / 50) and comp["per_problem"] == [2.0, 1.0]
    assert comp["lowest_per_problem"] == 1.0 and comp["below_095"] == 0 and "repeats" not in s
    slow = summarize(recs[:2] + [_rec(1, "spec", 50, 1.1), dict(_rec(1, "target", 50, 1.0),
                                                                 time_s_runs=[1.0, 1.3, 0.9])], n_boot=50)
    assert slow["comparisons"][0]["below_095"] == 1 and slow["comparisons"][0]["lowest_per_problem"] < 0.95
    assert slow["repeats"] == {"runs": 3, "median_spread": pytest.approx(1.3 / 0.9), "max_spread": pytest.approx(1.3 / 0.9)}
    assert "1 of 2 below 0.95x: p1 0.909x" in format_table(slow) and "run 3 times" in format_table(slow)
    assert slow["comparisons"][0]["below_095_ids"] == [["p1", pytest.approx(1 / 1.1)]]
    assert comp["below_095_ids"] == [] and "below 0.95x:" not in format_table(s)
    assert comp["identical_outputs"] == 1 and comp["same_grade"] == 1
    table = format_table(s)
    assert "speedup spec / target: 1.50x" in table and table.splitlines()[2].startswith("spec")
    json.dumps(s)  # JSON-serialisable


def test_summary_gives_each_repeat_run_alone():
    """--repeats: run k of both modes alone, as a benchmark that timed once would have seen each problem."""
    def rec(i, mode, tokens, runs):
        return dict(_rec(i, mode, tokens, sorted(runs)[(len(runs) - 1) // 2]), time_s_runs=runs)
    recs = [rec(0, "spec", 100, [1.0, 2.0]), rec(0, "target", 100, [2.0, 1.8]),   # run 1: 2.0x, run 2: 0.9x
            rec(1, "spec", 60, [1.0, 1.0]), rec(1, "target", 60, [0.8, 1.3]),    # run 1: 0.8x, run 2: 1.3x
            rec(2, "spec", 50, [1.0, 1.0]), rec(2, "target", 40, [1.0, 1.0])]    # 1.25x both (tokens differ)
    runs = summarize(recs, n_boot=50)["comparisons"][0]["by_run"]
    assert [r["run"] for r in runs] == [1, 2]
    assert runs[0]["below_095"] == 1 and runs[0]["lowest_per_problem"] == pytest.approx(0.8)
    assert runs[0]["median_per_problem"] == pytest.approx(1.25)
    assert runs[1]["below_095"] == 1 and runs[1]["lowest_per_problem"] == pytest.approx(0.9)
    assert runs[1]["median_per_problem"] == pytest.approx(1.25)
    assert runs[0]["below_095_ids"] == [["p1", pytest.approx(0.8)]] and runs[1]["below_095_ids"] == [
        ["p0", pytest.approx(0.9)]]  # each run names its own problems below 0.95x
    assert "run 1 median 1.25x, 1 below 0.95x (lowest 0.800x): p1 0.800x; run 2 median 1.25x, 1 below 0.95x " \
        "(lowest 0.900x): p0 0.900x" in format_table(summarize(recs, n_boot=50))
    noise = summarize(recs, n_boot=50)["comparisons"][0]["self_noise"]  # run 2's seconds over run 1's, a mode alone
    assert noise["target"]["below_095"] == 1 and noise["target"]["below_095_ids"] == [["p0", pytest.approx(0.9)]]
    assert noise["target"]["median_per_problem"] == pytest.approx(1.0)  # p0 0.9, p1 1.625, p2 1.0
    assert noise["spec"]["below_095"] == 0 and noise["spec"]["lowest_per_problem"] == pytest.approx(1.0)  # 2, 1, 1
    assert "against itself" in format_table(summarize(recs, n_boot=50)) and "spec 0 of 3 below 0.95x (lowest " \
        "1.000x); target 1 of 3 below 0.95x (lowest 0.900x)" in format_table(summarize(recs, n_boot=50))
    # one timing a generation (no --repeats), or a pair missing its runs: no by-run figures
    assert not {"by_run", "self_noise"} & set(summarize([_rec(0, "spec", 10, 1.0), _rec(0, "target", 10, 1.0)],
                                                         n_boot=20)["comparisons"][0])
    assert "by_run" not in summarize(recs[:2] + [_rec(1, "spec", 60, 1.0), _rec(1, "target", 60, 1.0)],
                                     n_boot=20)["comparisons"][0]


def test_time_split_sums_the_engine_timers_over_wall_seconds():
    a, b = _rec(0, "spec", 100, 2.0), _rec(1, "spec", 100, 2.0)
    a["stats"] = {"time_prefill": 0.2, "time_draft": 1.0, "time_verify": 0.6}
    b["stats"] = {"time_prefill": 0.2, "time_draft": 1.2, "time_verify": 0.6, "time_sample": 0.0}
    t = _rec(0, "target", 100, 3.0)
    t["stats"] = {"time_prefill": 0.3, "time_verify": 2.4}
    s = summarize([a, b, t, _rec(1, "target", 100, 3.0)], n_boot=50)
    assert s["modes"]["spec"]["time_split"] == pytest.approx(
        {"prefill": 0.1, "draft": 0.55, "verify": 0.3, "sample": 0.0, "other": 0.05})
    assert s["modes"]["target"]["time_split"]["other"] == pytest.approx(1 - 2.7 / 6.0)  # a record without timers
    lines = format_table(s).splitlines()
    assert "spec time: prefill 10.0%, draft steps 55.0%, target steps 30.0%, other 5.0%" in lines
    assert "target time: prefill 5.0%, target steps 40.0%, other 55.0%" in lines
    assert "time_split" not in summarize([_rec(0, "spec", 1, 1.0)], n_boot=10)["modes"]["spec"]  # no timers


# ----------------------------------------------------------------------------- the real engine

class IdTokenizer:
    """Token i <-> the i-th character of a small alphabet; a prompt's characters map into it."""

    ALPHABET = "0123456789 +-=*/.abcdefghijklmnopqrstuvwxyz\\{}<>|"
    stop_token_ids = {ALPHABET.index("|")}

    def encode(self, text):
        return [self.ALPHABET.index(c) if c in self.ALPHABET else 10 for c in text.lower()]

    def decode(self, ids):
        return "".join(self.ALPHABET[i] for i in ids)

    def apply_chat_template(self, messages, add_generation_prompt=True):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_run_loop_on_the_real_engine(tmp_path, temperature):
    gen = pytest.importorskip("minitorch.generation")
    from project.evaluation.runner import run_benchmark
    from project.evaluation.engine import engine_generators
    from test_generation_fakes import FakeModel

    tok = IdTokenizer()
    vocab = len(tok.ALPHABET)
    target = FakeModel(vocab, seed=1)
    draft = FakeModel(vocab, seed=2, like=target, noise=0.3)
    cfg = gen.SamplingConfig(temperature=temperature, seed=0)
    from minitorch.generation.engine import DrafterSpec, make_engine

    modes = engine_generators(make_engine(target, DrafterSpec("model", model=draft, gamma=3), cfg, vocab_size=vocab))
    problems = [Problem(f"p{i}", i, f"what is {i} + {i}?", str(2 * i)) for i in range(3)]
    out = tmp_path / "r.jsonl"
    outcome = run_benchmark(problems, modes, tok, out, {"t": temperature}, 40, progress=False)
    recs = read_results(out)
    assert not outcome.interrupted and len(recs) == 6
    for spec, plain in zip(recs[::2], recs[1::2]):
        assert spec["mode"] == "spec" and plain["mode"] == "target"
        assert spec["generated_tokens"] == plain["generated_tokens"] == 40 and spec["truncated"]
        st = spec["stats"]
        # with no stop token the per-round log derived from on_tokens is exact
        assert sum(st["round_drafted"]) == st["drafted"] and sum(st["round_accepted"]) == st["accepted"]
        assert st["prefill_tokens"] + sum(st["round_emitted"]) == 40 and 0.0 <= spec["alpha"] <= 1.0  # the prefill: 1
        if temperature == 0.0:
            assert spec["text"] == plain["text"]  # greedy speculative output is the target's
    s = summarize(recs, n_boot=100)
    if temperature == 0.0:
        assert s["comparisons"][0]["identical_outputs"] == 3
    # early / middle / late acceptance pooled over the problems, recomputed here from the per-round logs: a
    # round belongs to the third of the output its first token falls in
    acc, drafted = np.zeros(3), np.zeros(3)
    for spec in recs[::2]:
        st = spec["stats"]
        emitted = np.array(st["round_emitted"])
        third = np.minimum(2, (np.cumsum(emitted) - emitted) * 3 // emitted.sum())
        np.add.at(acc, third, st["round_accepted"])
        np.add.at(drafted, third, st["round_drafted"])
    assert acc.sum() == sum(r["stats"]["accepted"] for r in recs[::2]) and drafted.min() > 0
    assert s["modes"]["spec"]["output_acceptance"] == pytest.approx(
        {"early": acc[0] / drafted[0], "middle": acc[1] / drafted[1], "late": acc[2] / drafted[2]}, rel=1e-12)
    # the same seeds reproduce the same outputs on a second run
    again = tmp_path / "again.jsonl"
    run_benchmark(problems, modes, tok, again, {"t": temperature}, 40, progress=False)
    assert [r["text"] for r in read_results(again)] == [r["text"] for r in recs]


# ----------------------------------------------------------------------------- small random Qwen2 models

@pytest.fixture(scope="module")
def qwen2_pair(tmp_path_factory):
    """Folders of a tiny random Qwen2 target and a close draft (same weights + noise), with a BPE tokenizer."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("minitorch.models")
    from test_models_util import hf_qwen2, save_hf, tiny_bpe

    root = tmp_path_factory.mktemp("bench_qwen2")
    tok = tiny_bpe()
    target = hf_qwen2(seed=0, max_position_embeddings=1024)
    draft = hf_qwen2(seed=0, max_position_embeddings=1024)
    draft.load_state_dict(target.state_dict())
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=gen))
    return save_hf(target, root / "target", tok), save_hf(draft, root / "draft", tok)


def test_gsm8k_program_end_to_end_on_small_random_qwen2(tmp_path, qwen2_pair, capsys):
    """The real load path (cli_common), spec + target + transformers baselines, on 3 GSM8K problems."""
    from project.benchmark_gsm8k import GSM8K
    from project.evaluation.cli import main
    target, draft = qwen2_pair
    out = tmp_path / "r.jsonl"
    argv = ["--target", str(target), "--draft", str(draft), "--limit", "3", "--max-new-tokens", "12",
            "--gamma", "3", "-o", str(out), "--no-progress", "--compare-hf"]
    assert main(GSM8K, argv) == 0, capsys.readouterr().err
    recs = read_results(out)
    assert [(r["index"], r["mode"]) for r in recs] == [
        (i, m) for i in range(3) for m in ("spec", "target", "hf_greedy", "hf_assisted")]
    by = {(r["index"], r["mode"]): r for r in recs}
    for i in range(3):
        texts = {m: by[(i, m)]["text"] for m in ("spec", "target", "hf_greedy", "hf_assisted")}
        assert len(set(texts.values())) == 1, texts  # greedy: all four decoders give the target's output
        assert by[(i, "spec")]["prompt"].startswith("<|im_start|>system")
        assert by[(i, "spec")]["prompt_tokens"] > 20 and by[(i, "spec")]["alpha"] is not None
    s = json.loads((tmp_path / "r.summary.json").read_text())
    assert [(c["fast"], c["base"]) for c in s["comparisons"]][:2] == [("spec", "target"), ("hf_assisted", "hf_greedy")]
    assert s["comparisons"][0]["identical_outputs"] == 3
    assert (tmp_path / "r_plots" / "acceptance.png").is_file()
    # resume on the real path loads nothing new and redoes nothing
    assert main(GSM8K, argv + ["--resume", "--no-plots"]) == 0
    assert len(read_results(out)) == 12


def test_result_config_names_the_gpu_paths_on_cuda_only():
    from project.evaluation.cli import BenchSpec, build_parser

    from project.settings import resolve_settings

    def run_config(args):  # what load_engine stores: the resolved settings' record
        return resolve_settings(args).for_head(None).record()

    p = build_parser(BenchSpec("gsm8k", ("gsm8k",), "gsm8k", 64, "test"))
    cpu = run_config(p.parse_args([]))
    assert "gpu" not in cpu and cpu["backend"] == "cpu" and cpu["adaptive_gamma"] == "cost"  # the CPU's budget  # cpu result files of earlier runs still resume
    cuda = run_config(p.parse_args(["--backend", "cuda", "--gpu-prefill", "graph", "--gpu-draft-weights", "int8"]))
    assert cuda["gpu"] == {"fast_verify": False, "gpu_gemv": "auto", "gpu_draft_gemv": "auto",
                           "gpu_draft_weights": "int8", "gpu_prefill": "graph"}
    # the CUDA-graph path's draft-model defaults: 3 model tokens, 4 looked up (settings.default_gamma / _extend)
    assert {k: v for k, v in cuda.items() if k != "gpu"} == {**cpu, "backend": "cuda", "gamma": 3, "draft_extend": 4,
                                                                "adaptive_gamma": False}


# ----------------------------------------------------------------------------- --batch N: the target mode as a batch

@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_batch_run_loop_writes_the_records_of_one_at_a_time(tmp_path, temperature):
    """The target mode's generations as one batch of 2 (conversations' second turns joining as their first answers
    finish) write the records a run of one at a time writes: same texts, turns and stop reasons, every (id, mode)
    once; time_s is the sequence's own (its stats' time_total)."""
    from minitorch.generation import SamplingConfig
    from minitorch.generation.engine import make_engine
    from project.evaluation.batch import batch_generator
    from project.evaluation.engine import engine_generators
    from project.evaluation.runner import run_benchmark
    from test_generation_fakes import FakeModel

    tok = IdTokenizer()
    vocab = len(tok.ALPHABET)
    engine = make_engine(FakeModel(vocab, seed=1), "none", SamplingConfig(temperature=temperature, seed=3),
                         stop_ids=tok.stop_token_ids, vocab_size=vocab)
    target = {"target": engine_generators(engine)["target"]}
    problems = [Problem(f"p{i}", i, f"what is {i} + {i}?", str(2 * i)) for i in range(3)]
    problems += [Problem(f"c{i}", 3 + i, f"say {i}", "", (f"say {i}", f"and {i} again?")) for i in range(2)]
    one, many = tmp_path / "one.jsonl", tmp_path / "many.jsonl"
    run_benchmark(problems, target, tok, one, {"t": temperature}, 12, progress=False)
    out = run_benchmark(problems, target, tok, many, {"t": temperature}, 12, progress=False,
                        batch=batch_generator(engine, 2))
    assert not out.interrupted and len(out.new) == 5
    want = {r["id"]: r for r in read_results(one)}
    got = read_results(many)
    assert sorted(r["id"] for r in got) == sorted(want)
    for r in got:
        w = want[r["id"]]
        assert (r["text"], r["stop_reason"], r["generated_tokens"], r.get("turns")) == \
            (w["text"], w["stop_reason"], w["generated_tokens"], w.get("turns")), r["id"]
        assert r["time_s"] == r["stats"]["time_total"] > 0
    assert [len(r["turns"]) for r in got if r["id"].startswith("c")] == [2, 2]


def test_gsm8k_target_mode_as_a_batch_end_to_end(tmp_path, qwen2_pair, capsys):
    """--batch 2 on the real load path: the target mode alone (the default --modes with --batch), greedy texts equal
    to a run of one at a time, the batch in the results' settings and the summary's note on tokens/s."""
    from project.benchmark_gsm8k import GSM8K
    from project.evaluation.cli import main

    target, _ = qwen2_pair
    base = ["--target", str(target), "--limit", "3", "--max-new-tokens", "10", "--no-progress", "--no-plots"]
    assert main(GSM8K, base + ["-o", str(tmp_path / "b.jsonl"), "--batch", "2"]) == 0, capsys.readouterr().err
    assert "--batch 2: the target decoded 2 sequences at once" in capsys.readouterr().out
    assert main(GSM8K, base + ["-o", str(tmp_path / "one.jsonl"), "--modes", "target", "--drafter", "ngram"]) == 0
    batched, one = read_results(tmp_path / "b.jsonl"), read_results(tmp_path / "one.jsonl")
    assert {r["mode"] for r in batched} == {"target"} and len(batched) == 3
    assert {r["id"]: r["text"] for r in batched} == {r["id"]: r["text"] for r in one}
    cfg = batched[0]["config"]
    assert cfg["batch"] == 2 and cfg["drafter"] == "none" and cfg["gamma"] is None and "batch" not in one[0]["config"]


def test_a_gzip_results_file_reads_as_its_text_and_is_never_resumed(tmp_path):
    # docs/results/ keeps finished runs as .jsonl.gz: `summary` and every reader take them as they are
    recs = [_rec(0, "spec", 100, 1.0, alpha=0.5), _rec(0, "target", 100, 2.0)]
    text = "".join(json.dumps(r) + "\n" for r in recs)
    plain, packed = tmp_path / "r.jsonl", tmp_path / "r.jsonl.gz"
    plain.write_text(text)
    packed.write_bytes(gzip.compress(text.encode()))
    assert read_results(packed) == read_results(plain) == recs
    before = packed.read_bytes()
    with pytest.raises(BenchmarkError, match="gzip-compressed: a run cannot go on in it"):
        read_results(packed, repair=True)
    assert packed.read_bytes() == before  # left as it was
