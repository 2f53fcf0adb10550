"""Generation jobs, run one at a time or many as a batch (--batch N: the benchmarks' target mode, the text writers).

A job is a generator that yields generation requests, `(prompt_ids, max_new_tokens, seed)` (a GenerateFn's
arguments), receives each result (tokens, stop_reason, stats) and finally returns its value:

    def answer(question):
        res = yield (prompt_of(question), 512, seed)          # one generation ...
        if wants_a_follow_up(res):
            res2 = yield (follow_up_prompt(res), 256, seed)   # ... or more, each built from the last
        return record(res, res2)

`run_job(job, generate)` runs one with a GenerateFn, request after request, as a plain loop would. `run_jobs(jobs,
batch)` runs many through a BatchFn (`batch_generator`: minitorch's Engine.generate_batch) and yields each job's
`(key, value)` as it finishes, out of order: a job's next request enters the batch as soon as its last result comes
back, and while every running job waits on a sequence still being decoded the request stream says so (None) instead
of ending. Each job is keyed by the caller (an item id), and has one request in flight at a time.
"""
from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import Any, Callable, Generator, Iterable, Iterator, Optional

Request = tuple[list[int], int, int]  # prompt_ids, max_new_tokens, seed
Job = Generator[Request, Any, Any]
# (key, request) pairs, None while none is ready -> (key, result) as each sequence finishes
BatchFn = Callable[[Iterable[Optional[tuple[Any, Request]]]], Iterator[tuple[Any, Any]]]


def run_job(job: Job, generate: Callable[[list[int], int, int], Any]) -> Any:
    """The job's value, its requests generated one after another."""
    try:
        request = next(job)
        while True:
            request = job.send(generate(*request))
    except StopIteration as stop:
        return stop.value


def run_jobs(jobs: Iterable[tuple[Any, Job]], batch: BatchFn) -> Iterator[tuple[Any, Any]]:
    """(key, value) of each job as it finishes; jobs are started lazily, as the batch has room for their requests."""
    live: dict[Any, Job] = {}
    ready: deque[tuple[Any, Request]] = deque()
    waiting = iter(jobs)

    def requests() -> Iterator[Optional[tuple[Any, Request]]]:
        while True:
            if ready:
                yield ready.popleft()
            elif (nxt := next(waiting, None)) is not None:
                key, job = nxt
                if key in live:
                    raise ValueError(f"two jobs with the key {key!r}")
                try:
                    ready.append((key, next(job)))
                except StopIteration:
                    raise ValueError(f"job {key!r} asked for no generation") from None
                live[key] = job
            elif live:
                yield None  # every running job waits on a sequence being decoded
            else:
                return

    for key, result in batch(requests()):
        job = live[key]
        try:
            ready.append((key, job.send(result)))
        except StopIteration as stop:
            del live[key]
            yield key, stop.value


def batch_generator(engine: Any, batch: int, max_len: Optional[int] = None) -> BatchFn:
    """The BatchFn of a minitorch Engine (generation/engine.py, drafter "none"): each request its own seed, the
    engine's other sampling settings, `batch` sequences at once; results are the engine's GenerationResults."""
    from minitorch.generation import BatchRequest

    def run(requests: Iterable[Optional[tuple[Any, Request]]]) -> Iterator[tuple[Any, Any]]:
        reqs = (None if r is None else BatchRequest(list(r[1][0]), r[1][1], replace(engine.sampling, seed=r[1][2]),
                                                    key=r[0]) for r in requests)
        for res in engine.generate_batch(reqs, batch, max_len):
            yield res.key, res.result

    return run
