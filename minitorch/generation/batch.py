"""Batched decoding of the target alone (continuous batching): many sequences, one decode step for all of them.

    for r in run_batch(CpuSlots(model, slots=4, max_len=512, vocab_size=V), requests, SamplingConfig(), stop_ids):
        r.key, r.index, r.result.tokens, r.result.stop_reason      # as each sequence finishes

A backend (`SlotBackend`) holds `slots` sequences at once, each in its own slot: a KV cache of up to `max_len`
positions, its pending token and its sampler. `admit` fills free slots with new prompts (prefilled together in one
call) and returns each one's first new token; `step` runs one decode step of every occupied slot and returns each
slot's next token; `release` frees a slot. The backend knows no stop token and no length limit: `run_batch` does.

The scheduler (`run_batch`) keeps the batch full. It admits as many waiting requests as there are free slots in one
admit call, steps, and emits each slot's token with `emit` (autoregressive.py), so a stop token and the length limit
end a sequence exactly as in batch-1 `generate`. When a sequence ends it releases the slot, yields the sequence's
`BatchResult` at once, and before the next step refills every free slot from the requests, which it reads lazily (a
generator of requests is consumed only as slots free up). Sequences end when they end, not in the order they came:
a short answer admitted after a long one comes back first. Each result carries its request's `key` and `index` (its
position in the input order) so the caller can put it back in place; a writer that appends every finished answer at
once keeps all of them if it is interrupted.

A request iterable may yield None: "no request is ready yet" (a follow-up that needs the answer of a sequence still
being decoded). run_batch then stops pulling until the next step has run; it is an error while nothing is decoding.

What a result holds is what `generate` returns for that prompt alone: the same tokens (greedy; sampled too, where
the backend draws from the request's own `SamplingConfig.make_rng()` stream as CpuSlots does) and stop_reason, and
the statistics autoregressive_result gives, per sequence: new_tokens, target_forwards (the steps it took part in),
time_total (its wall seconds from its admission to its end, including the batch's other work meanwhile),
tokens_per_s (new_tokens / time_total: a sequence's own rate, not the batch's throughput, and not comparable with a
batch-1 run's), time_prefill (the admit call it was part of) and time_verify (the steps it took part in).

CpuSlots is the CPU reference backend: one KV cache a slot and sequential rows, so no speed on the CPU; it is there
as the reference the GPU's batch decoder (minitorch/cuda/) is checked against, and so the same engine call
(`Engine.generate_batch`, engine.py) runs on the CPU.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional, Protocol, Sequence

from .. import no_grad
from .autoregressive import autoregressive_result, check_request, context_limit, emit
from .sampling import SamplingConfig, logits_rows, next_token
from .stats import GenerationResult, Timer


@dataclass(frozen=True)
class BatchRequest:
    """One sequence to write: its prompt, its token limit, its sampling (None: the engine's) and the caller's id."""

    prompt_ids: Sequence[int]
    max_new_tokens: int
    sampling: Optional[SamplingConfig] = None  # None: the engine's settings
    key: Any = None  # the caller's id, handed back


@dataclass
class BatchResult:
    """A finished sequence: its request's key, the request's position in the input order, and what generate gives."""

    key: Any
    index: int
    result: GenerationResult  # tokens, stop_reason, stats: the same fields generate() gives


class SlotBackend(Protocol):
    """B sequences decoded at once, each in a slot (module docstring)."""

    slots: int  # sequences decoded at once (B)
    max_len: int  # cache positions a slot holds: len(prompt) + max_new_tokens must fit

    def check(self, prompt: list[int], max_new_tokens: int) -> None:
        """Raise ValueError (one line) for a request this backend cannot hold: empty prompt, longer than max_len,
        beyond the model's context."""

    def admit(self, entries: list[tuple[int, list[int], SamplingConfig]]) -> list[int]:
        """(slot, prompt, sampling) for free slots: cache each prompt in its slot (replacing whatever the slot held);
        return each entry's first new token (greedy, or sampled by its own config and seed)."""

    def step(self) -> list[int]:
        """One decode step of every occupied slot, feeding the slot's pending token (the last one returned for it);
        the next token of every slot (length `slots`; the entries of free slots mean nothing)."""

    def release(self, slot: int) -> None:
        """The slot's sequence is finished; the slot is free until an admit fills it."""


@dataclass
class _Sequence:
    """A request being decoded in a slot."""

    request: BatchRequest
    index: int
    t0: float  # when its admission began
    out: list[int]
    timer: Timer
    forwards: int = 0


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _advance(progress: Any, result: BatchResult) -> None:
    if progress is None:
        return
    if hasattr(progress, "update"):  # a tqdm bar: one a finished sequence
        progress.update(1)
    else:
        progress(result)


def run_batch(backend: SlotBackend, requests: Iterable[Optional[BatchRequest]], default_sampling: SamplingConfig,
              stop_ids: Iterable[int], progress: Any = None) -> Iterator[BatchResult]:
    """Decode every request on the backend's slots, yielding each BatchResult as its sequence finishes (module
    docstring: the scheduler, and why results come out of order). A request the backend cannot hold raises
    ValueError, one line naming the request's index. progress: advanced once a finished sequence, before its result
    is yielded (`progress.update(1)` for a tqdm-like bar, else `progress(result)`)."""
    stops = {int(s) for s in stop_ids}
    pending = iter(requests)
    exhausted = False
    free = list(range(backend.slots))
    live: dict[int, _Sequence] = {}
    count = 0  # requests read so far: the next one's index
    try:
        while True:
            # refill: as many ready requests as there are free slots, prefilled in one admit call
            admitted: list[tuple[int, _Sequence]] = []
            entries: list[tuple[int, list[int], SamplingConfig]] = []
            while free and not exhausted:
                try:
                    req = next(pending)
                except StopIteration:
                    exhausted = True
                    break
                if req is None:  # none ready until a running sequence finishes
                    if not live and not entries:
                        raise RuntimeError("the requests yielded None (none ready) while nothing is decoding: "
                                           "no result could ever make one ready")
                    break
                index, count = count, count + 1
                prompt = [int(t) for t in req.prompt_ids]
                try:
                    n = req.max_new_tokens
                    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                        raise ValueError(f"max_new_tokens must be an integer >= 1, got {n!r}")
                    backend.check(prompt, n)
                except ValueError as e:
                    key = "" if req.key is None else f" ({req.key!r})"
                    raise ValueError(f"request {index}{key}: {_one_line(e)}") from None
                slot = free.pop(0)
                seq = _Sequence(req, index, 0.0, [], Timer())
                admitted.append((slot, seq))
                entries.append((slot, prompt, req.sampling or default_sampling))
            finished: list[int] = []
            if entries:
                t0 = time.perf_counter()
                firsts = backend.admit(entries)
                dt = time.perf_counter() - t0
                for (slot, seq), tok in zip(admitted, firsts):
                    live[slot] = seq
                    seq.t0 = t0
                    seq.timer.add("prefill", dt)
                    if emit([int(tok)], seq.out, seq.request.max_new_tokens, stops)[1]:
                        finished.append(slot)
            elif live:
                t0 = time.perf_counter()
                toks = backend.step()
                dt = time.perf_counter() - t0
                for slot, seq in live.items():
                    seq.forwards += 1
                    seq.timer.add("verify", dt)
                    if emit([int(toks[slot])], seq.out, seq.request.max_new_tokens, stops)[1]:
                        finished.append(slot)
            elif exhausted:
                return
            # end the finished sequences: free their slots, then hand each result over at once
            done = []
            for slot in finished:
                seq = live.pop(slot)
                backend.release(slot)
                free.append(slot)
                res = autoregressive_result(seq.out, stops, seq.forwards, seq.timer, time.perf_counter() - seq.t0)
                done.append(BatchResult(seq.request.key, seq.index, res))
            free.sort()
            for r in done:
                _advance(progress, r)
                yield r
    finally:  # closed early (an error, an interrupted caller): leave no slot occupied
        for slot in list(live):
            backend.release(slot)


class CpuSlots:
    """The CPU reference SlotBackend over a minitorch CPU model (models/qwen2.py): one KV cache a slot.

    admit gives the slot a fresh cache of max_len positions, prefills the prompt and picks the first token with the
    slot's own `cfg.make_rng()`; step runs, slot after slot, one forward of each occupied slot's pending token and
    picks its next token with that slot's rng. So each row is exactly batch-1 `generate` of its request (same logits,
    same rng stream). The rows run one after another: no speed over batch 1 on the CPU. It is the reference for the
    GPU's batch decoder and lets the same engine call (Engine.generate_batch) run on the CPU. Candidate tokens are
    the first vocab_size logits (logits_rows), as generate's. A released slot's cache stays until the next admit
    replaces it.
    """

    def __init__(self, model: Any, slots: int, max_len: int, vocab_size: int) -> None:
        for name, v in (("slots", slots), ("max_len", max_len), ("vocab_size", vocab_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        limit = context_limit(model)
        if limit is not None and max_len > limit:
            raise ValueError(f"max_len {max_len} exceeds the model's context of {limit} positions")
        self.model, self.slots, self.max_len, self.vocab_size = model, slots, max_len, vocab_size
        self.caches: list[Any] = [None] * slots
        self.cfgs: list[Optional[SamplingConfig]] = [None] * slots
        self.rngs: list[Any] = [None] * slots
        self.pending: list[Optional[int]] = [None] * slots  # None: the slot is free

    def check(self, prompt: list[int], max_new_tokens: int) -> None:
        check_request(self.model, prompt, max_new_tokens)
        if len(prompt) + max_new_tokens > self.max_len:
            raise ValueError(f"prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                             f"batch's {self.max_len} cache positions a slot (max_len)")

    def new_cache(self, slot: int) -> Any:
        """A fresh cache for a slot being admitted (nothing of the slot's previous sequence in it)."""
        return self.model.new_cache(self.max_len)

    def forward(self, slot: int, ids: list[int]) -> Any:
        """The slot's model forward: ids appended to the slot's own cache; the last row's logits (a prompt's
        other rows are never projected on the vocabulary: autoregressive.prefill)."""
        return self.model(ids, self.caches[slot], last_n=1)

    def _pick(self, slot: int, logits: Any) -> int:
        tok = next_token(logits_rows(logits, self.vocab_size)[-1], self.cfgs[slot], self.rngs[slot])
        self.pending[slot] = tok
        return tok

    @no_grad()
    def admit(self, entries: list[tuple[int, list[int], SamplingConfig]]) -> list[int]:
        out = []
        for slot, prompt, cfg in entries:
            self.caches[slot] = self.new_cache(slot)
            self.cfgs[slot], self.rngs[slot] = cfg, cfg.make_rng()
            out.append(self._pick(slot, self.forward(slot, list(prompt))))
        return out

    @no_grad()
    def step(self) -> list[int]:
        out = [-1] * self.slots
        for slot, tok in enumerate(self.pending):
            if tok is not None:
                out[slot] = self._pick(slot, self.forward(slot, [tok]))
        return out

    def release(self, slot: int) -> None:
        self.pending[slot] = self.cfgs[slot] = self.rngs[slot] = None
