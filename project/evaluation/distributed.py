"""A benchmark run on a Ray cluster: one worker per GPU (or group of CPU cores), one JSONL file.

    python project/benchmark_gsm8k.py --ray                  # start a local Ray cluster on this machine
    python project/benchmark_gsm8k.py --ray auto             # the cluster `ray start --head` runs here
    python project/benchmark_gsm8k.py --ray HEAD_IP:6379     # a cluster's head node (docs/RAY.md)

Each worker is a Ray actor that builds the engine once, in its constructor, from the run's own flags
(the models load on the worker's node), and runs whole problems: every missing mode of one problem,
returned as the records the plain loop writes (runner.run_problem). The driver (this process) hands one
problem at a time to each idle worker, appends a finished problem's records to the results file at once
(so --resume, summary, merge, the plots and the progress bar work as for a plain run), and when a
worker dies (ray.kill, SIGKILL, a lost node) gives its unfinished problem to a fresh worker, at most
--ray-max-retries times a problem. Only the driver writes, so the file has each (problem, mode) once.

Nothing here runs without --ray; `ray` is imported inside the functions only (pip install -e ".[ray]").
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
from collections import deque
from pathlib import Path
from typing import Any, Callable, Sequence

from .data import BenchmarkError, Problem
from .runner import Progress, ResultsWriter, RunOutcome, plan_run, run_problem

EngineFactory = Callable[[argparse.Namespace, Sequence[str]], Any]
LOGS = "/tmp/ray/session_latest/logs"  # where a local Ray keeps the workers' stdout/stderr


class RayError(BenchmarkError):
    """--ray cannot run: ray missing, the cluster unreachable, or without the resources asked for."""


def add_ray_args(p: argparse.ArgumentParser) -> None:
    """--ray [ADDRESS], --ray-workers, --ray-cpus-per-worker, --ray-max-retries."""
    g = p.add_argument_group("ray (a run over a cluster's workers; docs/RAY.md)")
    g.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="run the problems on Ray workers (pip install -e '.[ray]'): alone, a local cluster on this "
                        "machine; 'auto' the cluster started here by 'ray start --head'; HOST:PORT a cluster's head")
    g.add_argument("--ray-workers", type=int, default=None, metavar="N",
                   help="number of workers (>= 1), each loading the models once (default: one per GPU with --backend "
                        "cuda, one per --ray-cpus-per-worker cores otherwise)")
    g.add_argument("--ray-cpus-per-worker", type=int, default=None, metavar="N",
                   help="CPU cores a worker reserves (>= 1; and its numba threads; default: with --backend cpu all the "
                        "cores of the smallest node, so one worker a node; with cuda 1)")
    g.add_argument("--ray-max-retries", type=int, default=2,
                   help="how many times a problem whose worker died runs again on a fresh worker (default 2)")


def check_ray_args(args: argparse.Namespace) -> None:
    """The --ray-* values, before anything starts: each one a user gives is checked (a worker count of 0 would
    leave the run waiting on no worker), and none without --ray."""
    given = {f: getattr(args, f, None) for f in ("ray_workers", "ray_cpus_per_worker")}
    for flag, value in given.items():
        if value is not None and value < 1:
            raise RayError(f"--{flag.replace('_', '-')} must be >= 1, got {value} (leave it out for the default)")
    if getattr(args, "ray_max_retries", 0) < 0:
        raise RayError(f"--ray-max-retries must be >= 0, got {args.ray_max_retries}")
    if getattr(args, "ray", None) is None:
        extra = [f for f, v in given.items() if v is not None] + (
            ["ray_max_retries"] if getattr(args, "ray_max_retries", 2) != 2 else [])
        if extra:
            raise RayError(f"--{extra[0].replace('_', '-')} is for a run over Ray workers: add --ray")


def import_ray() -> Any:
    """The ray module, or a one-line error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise RayError("--ray needs the ray package: pip install -e '.[ray]' (or pip install 'ray>=2.9')") from None
    return ray


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast on a HOST:PORT nobody listens on (ray.init itself retries for minutes)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host:
        return  # 'auto' and other forms: ray.init says what is wrong
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise RayError(f"cannot reach the Ray cluster at {address} ({e.strerror or e}): start it with "
                       "'ray start --head' on the head node, or check the address") from None


def connect(address: str) -> bool:
    """Join (or start) the cluster; True when this call started Ray, so the run shuts it down again.

    An already initialized Ray (a test's local cluster, a notebook) is used as it is.
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    target = None if address == "local" else address
    if (target or os.environ.get("RAY_ADDRESS")) not in (None, "", "auto", "local"):
        check_reachable(target or os.environ["RAY_ADDRESS"])
    try:
        ray.init(address=target, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                 configure_logging=True)
    except ConnectionError as e:
        hint = ("start one with 'ray start --head', or give --ray alone for a cluster of this machine"
                if address == "auto" else
                "check the address; a cluster with token authentication also needs RAY_AUTH_MODE=token here")
        raise RayError(f"cannot connect to a Ray cluster at {address} ({str(e).splitlines()[0].rstrip('.')}): "
                       f"{hint} (docs/RAY.md)") from None
    return True


def worker_env(backend: str, cpus: int) -> dict[str, str]:
    """Environment of a worker process: the driver's import paths (project/, the checkout, tests), the
    MINITORCH_* settings (model cache...), and with the CPU backend numba threads = its cores."""
    prefixes = tuple({sys.prefix, sys.base_prefix})
    paths = [os.path.abspath(p) for p in sys.path if p and os.path.isdir(p) and "-packages" not in p
             and not os.path.abspath(p).startswith(prefixes)]
    env = {k: v for k, v in os.environ.items() if k.startswith("MINITORCH_")}
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    if backend == "cpu":
        env["NUMBA_NUM_THREADS"] = str(cpus)
    return env


def plan_workers(args: argparse.Namespace, resources: dict[str, float],
                 node_cpus: Sequence[float]) -> tuple[int, int, int]:
    """(workers, CPUs each, GPUs each) from the flags and the cluster's resources; no GPU for cuda -> error."""
    check_ray_args(args)
    if args.backend == "cuda":
        gpus = int(resources.get("GPU", 0))
        if gpus < 1:
            raise RayError("the Ray cluster has no GPU, and --backend cuda runs one worker per GPU: start its nodes "
                           "on GPU machines (ray start ... --num-gpus N) or use --backend cpu")
        return args.ray_workers or gpus, args.ray_cpus_per_worker or 1, 1
    node_cpus = [c for c in node_cpus if c >= 1]  # a head started with --num-cpus 0 runs no worker
    cpus = args.ray_cpus_per_worker or int(min(node_cpus, default=1))
    if cpus > max(node_cpus, default=0):
        raise RayError(f"--ray-cpus-per-worker {cpus}: no node of the Ray cluster has that many CPUs "
                       f"(largest: {int(max(node_cpus, default=0))})")
    return args.ray_workers or max(1, sum(int(c) // cpus for c in node_cpus)), cpus, 0


class BenchWorker:
    """A Ray actor's state: the engine built once from the flags, and the records of the problems it runs.

    Errors a user can fix (a model that will not load, a prompt too long) come back as ("error", line),
    so the driver can stop the run with that one line; a crash of the process is the driver's to retry.
    """

    def __init__(self, factory: EngineFactory, args: argparse.Namespace, modes: Sequence[str],
                 base_config: dict[str, Any], system_prompt: str | None, cwd: str) -> None:
        if os.path.isdir(cwd):  # relative paths in the flags (--target, --data-dir...) as the driver means them
            os.chdir(cwd)
        self.error: str | None = None
        self.args, self.system_prompt = args, system_prompt
        try:
            self.engine = factory(args, list(modes))
        except (ValueError, OSError) as e:
            self.error = _one_line(e)
            return
        self.config = {**base_config, **self.engine.config}

    def ready(self) -> tuple[str, Any]:
        """("ok", the records' config) once the models are loaded, or ("error", why not)."""
        return ("error", self.error) if self.error else ("ok", self.config)

    def run(self, problem: Problem, order: Sequence[str]) -> tuple[str, Any]:
        """("ok", the records of `problem`'s modes in `order`) or ("error", a one-line reason)."""
        try:
            return "ok", run_problem(problem, self.engine.modes, order, self.engine.tokenizer, self.config,
                                     self.args.max_new_tokens, seed=self.engine.config.get("seed", 0),
                                     system_prompt=self.system_prompt, shard=self.args.shard)
        except (ValueError, OSError) as e:
            return "error", _one_line(e)


def _one_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return f"{getattr(e, 'filename', None) or ''}: {e.strerror}" if isinstance(e, OSError) and e.strerror else msg


def _last_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip() and set(line.strip()) != {"^"}]
    return lines[-1] if lines else type(e).__name__


class RayRun:
    """The driver's loop: start the workers, hand out problems, write records as they come, replace the dead."""

    def __init__(self, ray: Any, args: argparse.Namespace, modes: Sequence[str], base_config: dict[str, Any],
                 factory: EngineFactory, system_prompt: str | None) -> None:
        self.ray, self.args = ray, args
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        self.n_workers, cpus, gpus = plan_workers(args, ray.cluster_resources(),
                                                  [n["Resources"].get("CPU", 0) for n in nodes])
        self.actor_class = ray.remote(BenchWorker).options(
            num_cpus=cpus, num_gpus=gpus, max_restarts=0,
            runtime_env={"env_vars": worker_env(args.backend, cpus)})
        self.init_args = (factory, args, list(modes), base_config, system_prompt, os.getcwd())
        self.starting: dict[Any, Any] = {}  # ready() future -> actor
        self.idle: list[Any] = []
        self.running: dict[Any, tuple[Any, Problem, list[str]]] = {}  # run() future -> (actor, problem, modes)
        self.queue: deque[tuple[Problem, list[str]]] = deque()
        self.deaths: dict[str, int] = {}  # problem id -> workers lost while running it
        self.startup_deaths = 0
        self.config: dict[str, Any] | None = None
        print(f"ray: {self.n_workers} workers of {gpus} GPU + {cpus} CPU each; cluster of {len(nodes)} nodes, "
              f"{ray.cluster_resources().get('CPU', 0):g} CPUs, {ray.cluster_resources().get('GPU', 0):g} GPUs; "
              f"the workers' output: {LOGS} on each node", file=sys.stderr)

    def start_worker(self) -> None:
        actor = self.actor_class.remote(*self.init_args)
        self.starting[actor.ready.remote()] = actor

    def requeue(self, problem: Problem, order: list[str], why: str) -> None:
        """A worker died running `problem`: run it again first, on the next free worker (a fresh one)."""
        n = self.deaths[problem.id] = self.deaths.get(problem.id, 0) + 1
        if n > self.args.ray_max_retries:
            raise RayError(f"problem {problem.id}: its Ray worker died {n} times ({why}); finished problems are "
                           f"kept, rerun with --resume (worker logs: {LOGS})")
        self.queue.appendleft((problem, order))

    def wait_config(self) -> dict[str, Any]:
        """Start the workers; the records' settings, from the first worker whose models loaded."""
        for _ in range(self.n_workers):
            self.start_worker()
        while self.config is None:
            self.step()
        return self.config

    def step(self, writer: ResultsWriter | None = None, outcome: RunOutcome | None = None,
             bar: Progress | None = None) -> None:
        """Hand problems to idle workers, then take in whatever finished within a second."""
        while self.idle and self.queue:
            actor = self.idle.pop()
            problem, order = self.queue.popleft()
            self.running[actor.run.remote(problem, order)] = (actor, problem, order)
        refs = list(self.running) + list(self.starting)
        if not refs:  # cannot happen: every lost worker is replaced or the run stops
            raise RayError("no Ray worker left to run the remaining problems")
        done, _ = self.ray.wait(refs, num_returns=1, timeout=1.0)
        for ref in done:
            if ref in self.starting:
                self._started(ref)
            else:
                self._finished(ref, writer, outcome, bar)

    def _started(self, ref: Any) -> None:
        actor = self.starting.pop(ref)
        try:
            status, value = self.ray.get(ref)
        except self.ray.exceptions.RuntimeEnvSetupError as e:
            raise RayError(f"a Ray worker could not start: {_last_line(e)}") from None
        except self.lost_errors() as e:
            if getattr(e, "actor_init_failed", False):  # its constructor raised (not a user error): say what
                raise RayError(f"a Ray worker failed while loading the models: {_last_line(e)}") from None
            self.startup_deaths += 1  # e.g. killed while loading the models; a bounded number of fresh tries
            if self.startup_deaths > self.n_workers * (self.args.ray_max_retries + 1):
                raise RayError(f"Ray workers died {self.startup_deaths} times while loading the models "
                               f"({type(e).__name__}); worker logs: {LOGS}") from None
            self.start_worker()
            return
        if status == "error":
            raise RayError(f"{value} (in a Ray worker, loading the models)")
        if self.config is None:
            self.config = value
        elif value != self.config:
            diff = sorted(k for k in set(value) | set(self.config) if value.get(k) != self.config.get(k))
            raise RayError(f"Ray workers disagree on the settings ({', '.join(diff[:3])}): every node needs the "
                           "same checkout, models and packages")
        self.idle.append(actor)

    def _finished(self, ref: Any, writer: ResultsWriter | None, outcome: RunOutcome | None,
                  bar: Progress | None) -> None:
        actor, problem, order = self.running.pop(ref)
        try:
            status, value = self.ray.get(ref)
        except self.lost_errors() as e:
            self._kill(actor)  # dead already, or unreachable: either way its slot goes to a fresh worker
            self.requeue(problem, order, type(e).__name__)
            self.start_worker()
            return
        if status == "error":
            raise RayError(f"{value} (in a Ray worker)")
        for rec in value:
            writer.write(rec)
            outcome.new.append(rec)
            bar.add(rec)
        self.idle.append(actor)

    def lost_errors(self) -> tuple[type[BaseException], ...]:
        ex = self.ray.exceptions
        return (ex.RayActorError, ex.WorkerCrashedError, ex.NodeDiedError, ex.OutOfMemoryError, ex.ObjectLostError)

    def shutdown(self) -> None:
        """Kill every worker (they hold models and GPUs); finished records are already on disk."""
        for actor in [*self.starting.values(), *self.idle, *(a for a, _, _ in self.running.values())]:
            self._kill(actor)

    def _kill(self, actor: Any) -> None:
        try:
            self.ray.kill(actor, no_restart=True)
        except Exception:  # already gone
            pass


def run_on_ray(args: argparse.Namespace, problems: Sequence[Problem], modes: Sequence[str], output: Path,
               base_config: dict[str, Any], factory: EngineFactory, *, system_prompt: str | None = None,
               progress: bool = True) -> RunOutcome:
    """run_benchmark's work on Ray workers (same records, same file); `factory(args, modes)` -> Engine runs
    in each worker, so it and `args` must pickle (load_engine and an argparse Namespace do)."""
    if args.max_new_tokens < 1:
        raise BenchmarkError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    ray = import_ray()
    started = connect(args.ray)
    run = None
    try:
        run = RayRun(ray, args, modes, base_config, factory, system_prompt)
        config = run.wait_config()
        previous, order, todo = plan_run(problems, modes, output, config, args.max_new_tokens, args.resume)
        missing: dict[str, list[str]] = {}
        for problem, mode in todo:
            missing.setdefault(problem.id, []).append(mode)
        run.queue.extend((p, missing[p.id]) for p in problems if p.id in missing)
        outcome = RunOutcome(new=[], previous=previous)
        bar = Progress(progress, problems, order, todo, previous, str(config.get("dataset", "bench")))
        try:
            with ResultsWriter(output) as writer:
                while run.queue or run.running:
                    run.step(writer, outcome, bar)
        except KeyboardInterrupt:
            outcome.interrupted = True
        finally:
            bar.close()
        return outcome
    finally:
        if run is not None:
            run.shutdown()
        if started:
            ray.shutdown()
