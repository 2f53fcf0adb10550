"""Benchmarks on Ray (`--ray`, project/evaluation/distributed.py), on a local cluster of two CPU workers:
the records equal a plain run's; a worker killed mid-problem (SIGKILL, ray.kill) loses nothing and its
problem runs again; an interrupted Ray run resumes; user errors are one line and exit 2.

The workers run test_benchmarks' FakeEngine (answers by lookup, text from the seed), with faults keyed
to marker files so each fault happens exactly once whichever worker meets it; one test runs the real
load path (a tiny random Qwen2 pair) in the workers."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
# a Ray hang (a worker that never starts, a connect that retries for minutes) fails the test instead of CI
pytestmark = [pytest.mark.timeout(180)] if importlib.util.find_spec("pytest_timeout") else []

import test_benchmarks as tb  # noqa: E402
from project.benchmark_gsm8k import GSM8K  # noqa: E402
from project.evaluation import distributed, runner  # noqa: E402
from project.evaluation.cli import main  # noqa: E402
from project.evaluation.runner import read_results  # noqa: E402

data_file = tb.data_file  # the five problems of test_benchmarks, as a JSONL file
RAY = ["--ray", "--ray-cpus-per-worker", "1", "--no-plots"]  # two workers on the two CPUs of the cluster


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster (2 CPUs, no GPU) for the module: starting one costs ~5-10 s on this box."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


@dataclass
class WorkerFake:
    """The engine factory each Ray worker calls: FakeEngine, its records' stats tagged with the worker's pid.

    Faults, decided through files in `flags` (shared by all workers of this machine):
    kill_at: that problem's target mode kills its worker after its spec mode ran (first attempt only,
    or every attempt with `always`), by SIGKILL or by ray.kill; meet = (a, b): problem a waits until
    problem b has started, so the run needs two workers at once; load_error: the constructor fails.
    """

    flags: str
    kill_at: int | None = None
    how: str = "sigkill"
    always: bool = False
    meet: tuple[int, int] | None = None
    load_error: bool = False

    def __call__(self, args, modes):
        if self.load_error:
            raise ValueError("model folder not found: /nowhere")
        fake = tb.FakeEngine()
        engine = fake.factory(args, modes)
        engine.modes = {m: self._wrap(fake, m, g) for m, g in engine.modes.items()}
        return engine

    def _first(self, name: str) -> bool:
        try:
            os.close(os.open(Path(self.flags, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return True
        except FileExistsError:
            return False

    def _wrap(self, fake, mode, gen):
        def run(ids, max_new_tokens, seed):
            k = fake.order.index(fake._question(ids))
            Path(self.flags, f"started-{k}").touch()
            if self.meet and k == self.meet[0]:
                deadline = time.time() + 60
                while not Path(self.flags, f"started-{self.meet[1]}").exists():
                    if time.time() > deadline:
                        raise RuntimeError("problem 1 never started while problem 0 ran: one worker only?")
                    time.sleep(0.01)
            if k == self.kill_at and mode == "target" and (self._first(f"killed-{k}") or self.always):
                Path(self.flags, f"killed-{k}").write_text(str(os.getpid()))
                if self.how == "sigkill":
                    os.kill(os.getpid(), signal.SIGKILL)
                ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
                time.sleep(60)  # killed long before this ends
            res = gen(ids, max_new_tokens, seed)
            res.stats["pid"] = os.getpid()
            return res
        return run


def ray_run(argv: list[str], factory) -> int:
    return main(GSM8K, argv + RAY + ["--no-progress"], engine_factory=factory)


def plain_records(tmp_path: Path, data_file: Path, limit: int) -> list[dict]:
    out = tmp_path / "plain.jsonl"
    assert tb.run(["--data-file", str(data_file), "--limit", str(limit), "-o", str(out), "--no-plots"],
                  tb.FakeEngine()) == 0
    return read_results(out)


def check_same_as_plain(records: list[dict], plain: list[dict]) -> None:
    """Each (problem, mode) exactly once, and the records equal the plain run's but for timing fields."""
    keys = [(r["index"], r["mode"]) for r in records]
    assert len(keys) == len(set(keys)), "a generation was written twice"
    order = lambda r: (r["index"], r["mode"])  # noqa: E731
    assert tb.strip_volatile(sorted(records, key=order)) == tb.strip_volatile(sorted(plain, key=order))


# ----------------------------------------------------------------------------- same records as a plain run

def test_ray_run_equals_a_plain_run(cluster, tmp_path, data_file, capsys):
    out = tmp_path / "ray.jsonl"
    factory = WorkerFake(str(tmp_path), meet=(0, 1))
    assert ray_run(["--data-file", str(data_file), "-o", str(out)], factory) == 0, capsys.readouterr().err
    records = read_results(out)
    check_same_as_plain(records, plain_records(tmp_path, data_file, 5))
    assert len({r["stats"]["pid"] for r in records}) == 2  # two workers, each problem's modes on one of them
    assert all(len({r["stats"]["pid"] for r in records if r["index"] == i}) == 1 for i in range(5))
    assert "speedup spec / target" in capsys.readouterr().out  # the summary of the file, as after a plain run
    assert json.loads(out.with_suffix(".summary.json").read_text())["n_problems"] == 5


# ----------------------------------------------------------------------------- faults

def _check_kill_run(tmp_path: Path, data_file: Path, how: str) -> None:
    out = tmp_path / "ray.jsonl"
    flags = tmp_path / "flags"
    flags.mkdir()
    assert ray_run(["--data-file", str(data_file), "-o", str(out)], WorkerFake(str(flags), kill_at=2, how=how)) == 0
    killed = int((flags / "killed-2").read_text())
    records = read_results(out)
    check_same_as_plain(records, plain_records(tmp_path, data_file, 5))
    assert {r["stats"]["pid"] for r in records if r["index"] == 2} - {killed}  # done again, by another worker


@pytest.mark.parametrize("how", ["sigkill", "ray.kill"])
def test_a_killed_worker_loses_nothing_and_its_problem_runs_again(cluster, tmp_path, data_file, how):
    _check_kill_run(tmp_path, data_file, how)


def test_kill_check_catches_a_driver_that_drops_a_dead_workers_problem(cluster, tmp_path, data_file, monkeypatch):
    monkeypatch.setattr(distributed.RayRun, "requeue", lambda self, problem, order, why: None)
    with pytest.raises(AssertionError):
        _check_kill_run(tmp_path, data_file, "sigkill")


def test_a_problem_that_always_kills_its_worker_stops_then_resume_finishes(cluster, tmp_path, data_file, capsys):
    out = tmp_path / "ray.jsonl"
    argv = ["--data-file", str(data_file), "-o", str(out)]
    factory = WorkerFake(str(tmp_path), kill_at=2, always=True)
    assert ray_run(argv + ["--ray-max-retries", "1"], factory) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "problem problems-2: its Ray worker died 2 times" in err[-1] and "Traceback" not in "".join(err)
    kept = read_results(out)
    assert 2 not in {r["index"] for r in kept} and len(kept) == len({(r["index"], r["mode"]) for r in kept})
    assert ray_run(argv + ["--resume"], WorkerFake(str(tmp_path))) == 0
    check_same_as_plain(read_results(out), plain_records(tmp_path, data_file, 5))


def test_an_interrupted_ray_run_resumes_without_redoing_anything(cluster, tmp_path, data_file, monkeypatch, capsys):
    """Ctrl-C (or SIGTERM) in the driver after 3 records: problem 1 has its spec mode only; --resume runs the rest."""
    out = tmp_path / "ray.jsonl"
    argv = ["--data-file", str(data_file), "-o", str(out)]
    write = runner.ResultsWriter.write

    def write_then_interrupt(self, record):
        write(self, record)
        if len(read_results(self.path)) == 3:
            raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(runner.ResultsWriter, "write", write_then_interrupt)
        assert ray_run(argv, WorkerFake(str(tmp_path))) == 130
    assert "rerun with --resume" in capsys.readouterr().err
    before = out.read_bytes()
    assert len(read_results(out)) == 3
    assert ray_run(argv + ["--resume"], WorkerFake(str(tmp_path))) == 0
    assert out.read_bytes().startswith(before)  # the first run's lines kept as they were
    check_same_as_plain(read_results(out), plain_records(tmp_path, data_file, 5))


# ----------------------------------------------------------------------------- user errors: one line, exit 2

def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _error_line(capsys) -> str:
    """The error line: the last one on stderr, the only one starting 'error:' (after the 'ray: N workers' line)."""
    err = capsys.readouterr().err.strip().splitlines()
    assert [e for e in err if e.startswith("error: ")] == err[-1:] and not err[0].startswith("Traceback"), err
    assert len(err) == 1 or (len(err) == 2 and err[0].startswith("ray: ")), err
    return err[-1]


def test_without_ray_installed_is_one_line(tmp_path, data_file, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    assert ray_run(["--data-file", str(data_file), "-o", str(tmp_path / "r.jsonl")], WorkerFake(str(tmp_path))) == 2
    assert "pip install -e '.[ray]'" in _error_line(capsys)


def test_an_unreachable_cluster_is_one_line(tmp_path, data_file, monkeypatch, capsys):
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # as in a fresh process
    argv = ["--data-file", str(data_file), "-o", str(tmp_path / "r.jsonl"), "--ray", f"127.0.0.1:{_closed_port()}"]
    assert main(GSM8K, argv, engine_factory=WorkerFake(str(tmp_path))) == 2
    assert "cannot reach the Ray cluster at 127.0.0.1:" in _error_line(capsys)


@pytest.mark.parametrize("extra, factory, message", [
    (["--backend", "cuda"], {}, "the Ray cluster has no GPU"),
    (["--ray-cpus-per-worker", "3"], {}, "no node of the Ray cluster has that many CPUs"),
    ([], {"load_error": True}, "model folder not found: /nowhere (in a Ray worker, loading the models)"),
])
def test_cluster_and_worker_errors_are_one_line(cluster, tmp_path, data_file, capsys, extra, factory, message):
    argv = ["--data-file", str(data_file), "-o", str(tmp_path / "r.jsonl")]
    assert main(GSM8K, argv + RAY + extra + ["--no-progress"], engine_factory=WorkerFake(str(tmp_path), **factory)) == 2
    assert message in _error_line(capsys)


def test_ray_is_imported_only_with_the_flag():
    code = ("import sys; sys.path[:0] = [{p!r}]; import project.evaluation.cli, project.evaluation.distributed; "
            "assert 'ray' not in sys.modules").format(p=str(tb.ROOT))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert not [f for f in (tb.ROOT / "minitorch").rglob("*.py") if "import ray" in f.read_text()]


# ----------------------------------------------------------------------------- the real load path in the workers

def test_real_engine_in_ray_workers_equals_a_plain_run(cluster, tmp_path, capsys):
    """load_engine itself (cli_common, a tiny random Qwen2 pair from folders) in each worker, greedy."""
    pytest.importorskip("torch")
    from test_models_util import hf_qwen2, save_hf, tiny_bpe

    tok = tiny_bpe()
    target = save_hf(hf_qwen2(seed=0, max_position_embeddings=1024), tmp_path / "target", tok)
    draft = save_hf(hf_qwen2(seed=1, max_position_embeddings=1024), tmp_path / "draft", tok)
    argv = ["--target", str(target), "--draft", str(draft), "--limit", "2", "--max-new-tokens", "8",
            "--gamma", "3", "--no-progress", "--no-plots"]
    assert main(GSM8K, argv + ["-o", str(tmp_path / "plain.jsonl")]) == 0
    assert main(GSM8K, argv + ["-o", str(tmp_path / "ray.jsonl")] + RAY) == 0, capsys.readouterr().err
    timed = lambda recs: [{k: v for k, v in r.items() if k != "predicted_speedup"} for r in recs]  # noqa: E731
    # predicted_speedup holds the measured cost ratio of a draft and a target step: a timing, like time_s
    check_same_as_plain(timed(read_results(tmp_path / "ray.jsonl")), timed(read_results(tmp_path / "plain.jsonl")))


@pytest.mark.parametrize("flags, resources, node_cpus, plan", [
    ({}, {"CPU": 34}, [0, 16, 16, 2], (17, 2, 0)),  # all the cores of the smallest node; a 0-CPU head runs none
    ({"ray_cpus_per_worker": 4}, {"CPU": 32}, [16, 16], (8, 4, 0)),
    ({"ray_workers": 3}, {"CPU": 32}, [16, 16], (3, 16, 0)),
    ({"backend": "cuda"}, {"CPU": 32, "GPU": 8}, [16, 16], (8, 1, 1)),  # one worker a GPU
])
def test_worker_plan_from_the_cluster(flags, resources, node_cpus, plan):
    args = argparse.Namespace(**{"backend": "cpu", "ray": "local", "ray_workers": None, "ray_cpus_per_worker": None,
                                 "ray_max_retries": 2, **flags})
    assert distributed.plan_workers(args, resources, node_cpus) == plan
