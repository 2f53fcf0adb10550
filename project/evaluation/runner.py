"""Shared benchmark code for GSM8K and LIMO: the run loop and its JSONL results (resume, merge).

One JSONL line per (problem, mode), appended and fsync'ed as soon as that generation finishes, so an
interrupted run (Ctrl-C or kill) loses at most the generation in progress and `--resume` redoes
nothing that was finished. Every line carries the run's `config` (models, sampling, gamma, ...):
resuming into or merging files made with different settings is refused.

The generation itself is injected: `modes` maps a mode name ("spec", "target", "hf_greedy",
"hf_assisted") to a callable `(prompt_ids, max_new_tokens, seed) -> result` where `result` has
`.tokens` (new tokens), `.stop_reason` ("stop" | "length") and `.stats` (dict), as
`minitorch.generation.GenerationResult` does. Tests pass fake generators; the programs pass the engine.
`run_problem` (one problem's modes -> its records) is what a Ray worker runs (distributed.py, --ray); the
plain loop makes the same records one generation at a time. With --batch N (the target mode alone) they are
generated N at once (`batch_records`, batch.py's jobs over minitorch's Engine.generate_batch) and each record is
written as its generation finishes, out of order; resume goes by (id, mode) either way.
Problems and prompts: data.py; summary: summary.py; plots: plots.py;
the command line: cli.py; transformers baselines: hf.py; grading: grading.py.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from .batch import BatchFn, Job, run_job, run_jobs
from .data import GZIP_MAGIC, BenchmarkError, Problem, Tokenizer, build_prompt, conversation_prompt, gunzipped
from .grading import grade

MODE_ORDER = ("spec", "target", "hf_greedy", "hf_assisted")
# Fields that differ between two runs of the same generation (timing); the rest is reproducible.
VOLATILE_FIELDS = ("time_s", "tokens_per_s", "stats", "finished_at", "shard", "time_s_runs")


GenerateFn = Callable[[list[int], int, int], Any]  # (prompt_ids, max_new_tokens, seed) -> result


# ----------------------------------------------------------------------------- results files

def read_results(path: str | Path, repair: bool = False, keys: tuple[str, ...] = ("id", "mode")) -> list[dict[str, Any]]:
    """Records of a results JSONL file (each holding `keys`: a benchmark's "id" and "mode"; a text writer's "id").

    A last line cut off by a kill mid-write is dropped (and, with `repair`, cut from the file so
    appending continues cleanly); a bad line elsewhere is an error. A gzip file (a finished run kept compressed, as
    docs/results/ keeps them) is read whole, never repaired: a run does not go on in one.
    """
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    if repair and data[:2] == GZIP_MAGIC:
        raise BenchmarkError(f"{path} is gzip-compressed: a run cannot go on in it (decompress it first)")
    data = gunzipped(data)
    records: list[dict[str, Any]] = []
    pos = 0
    lines = data.split(b"\n")
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                rec = json.loads(line)
            except ValueError:
                # the last line, with no newline after it and our writer's first key: a write cut off
                # by a kill. Drop it (and cut it from the file with `repair`); anything else is an error.
                if n == len(lines) and line.startswith(b'{"id": '):
                    if repair:
                        with open(path, "r+b") as f:
                            f.truncate(pos)
                    break
                rec = None
            if not isinstance(rec, dict) or any(k not in rec for k in keys):
                raise BenchmarkError(f"{path}:{n}: not a results record; is this a benchmark JSONL file?")
            records.append(rec)
        pos += len(line) + 1
    return records


def _json_default(obj: Any) -> Any:
    """numpy scalars and arrays (engine stats may hold them) -> plain Python values."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"cannot write {type(obj).__name__} to JSON")


class ResultsWriter:
    """Appends one JSON line per finished generation and forces it to disk at once."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", encoding="utf-8")

    def write(self, record: Mapping[str, Any]) -> None:
        self._f.write(json.dumps(record, ensure_ascii=False, default=_json_default) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "ResultsWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_config(records: Iterable[Mapping[str, Any]], config: Mapping[str, Any], where: str) -> None:
    """Refuse to mix results made with different settings (models, sampling, gamma, max tokens...)."""
    for rec in records:
        old = rec.get("config", {})
        if old != dict(config):
            diff = sorted(k for k in set(old) | set(config) if old.get(k) != config.get(k))
            detail = ", ".join(f"{k}: {old.get(k)!r} vs {config.get(k)!r}" for k in diff[:3])
            raise BenchmarkError(f"{where} was made with different settings ({detail}); "
                                 "use another --output or matching flags")


def mode_key(mode: str) -> tuple[int, str]:
    """Sort key: the canonical mode order, then other names alphabetically."""
    return (MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER), mode)


def merge_results(inputs: Sequence[str | Path], output: str | Path) -> list[dict[str, Any]]:
    """Join shard files into one, sorted by (problem index, mode); same settings required."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    first_config: dict[str, Any] | None = None
    for path in inputs:
        if not Path(path).is_file():
            raise BenchmarkError(f"results file not found: {path}")
        recs = read_results(path)
        if recs and first_config is None:
            first_config = recs[0].get("config", {})
        if first_config is not None:
            check_config(recs, first_config, str(path))
        for rec in recs:
            seen.setdefault((rec["id"], rec["mode"]), rec)  # the same generation twice: keep one
    merged = sorted(seen.values(), key=lambda r: (r.get("index", 0), r["id"], mode_key(r["mode"])))
    out = Path(output)
    if out.resolve() in {Path(p).resolve() for p in inputs}:
        raise BenchmarkError(f"--output {out} is one of the inputs; choose a new file")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for rec in merged:
            f.write(json.dumps(rec, ensure_ascii=False, default=_json_default) + "\n")
    os.replace(tmp, out)
    return merged


# ----------------------------------------------------------------------------- the run loop

class RoundLog:
    """An `on_tokens` callback for speculative_generate: how many tokens each round emitted."""

    def __init__(self) -> None:
        self.emitted: list[int] = []

    def __call__(self, tokens: Sequence[int]) -> None:
        self.emitted.append(len(tokens))


def round_log_stats(emitted: Sequence[int], gamma: int, max_new_tokens: int, adaptive: bool,
                    start: int = 0) -> dict[str, list[int]]:
    """Per-round log from the emitted counts: `round_emitted`, and with a fixed gamma also
    `round_drafted` (the engine drafts min(gamma, tokens left - 1)) and `round_accepted` (emitted - 1;
    only a final round cut by a stop token inside the drafts can be off, by one). start: tokens emitted before the
    first round (the CPU engine's prefill gives the first token)."""
    out: dict[str, list[int]] = {"round_emitted": list(emitted)}
    if adaptive:
        return out
    drafted, accepted = [], []
    pos = start
    for e in emitted:
        d = max(0, min(gamma, max_new_tokens - pos - 1))
        drafted.append(d)
        accepted.append(max(0, min(e - 1, d)))
        pos += e
    out["round_drafted"], out["round_accepted"] = drafted, accepted
    return out


def thirds_counts(stats: Mapping[str, Any]) -> list[list[int]] | None:
    """[accepted, drafted] in the early, middle and late third of the output, from the per-round log.

    Needs `stats["round_drafted"]` and `stats["round_accepted"]` (one entry per verification, in
    order) and uses `round_emitted` for positions when present; None when the log is absent.
    """
    drafted, accepted = stats.get("round_drafted"), stats.get("round_accepted")
    if not drafted or accepted is None or len(drafted) != len(accepted):
        return None
    emitted = stats.get("round_emitted")
    if not emitted or len(emitted) != len(drafted):
        emitted = [a + 1 for a in accepted]  # each round emits its accepted drafts plus one target token
    total = sum(emitted)
    sums = [[0, 0], [0, 0], [0, 0]]
    pos = 0
    for d, a, e in zip(drafted, accepted, emitted):
        third = min(2, 3 * pos // max(total, 1))
        sums[third][0] += a
        sums[third][1] += d
        pos += e
    return sums


def output_thirds(stats: Mapping[str, Any]) -> list[float | None] | None:
    """Acceptance (accepted / drafted) in the early, middle and late third of the output, or None."""
    sums = thirds_counts(stats)
    return None if sums is None else [a / d if d else None for a, d in sums]


def make_record(problem: Problem, mode: str, prompt: str, prompt_ids: Sequence[int], result: Any,
                text: str, seconds: float, config: Mapping[str, Any], shard: str) -> dict[str, Any]:
    """One JSONL line: what was asked, what came back, the grade, the timing and the acceptance."""
    tokens = list(result.tokens)
    stats = dict(getattr(result, "stats", None) or {})
    graded = grade(text, problem.gold) if problem.graded else {"extracted": None, "extraction": "none",
                                                                 "correct": None}
    speculative = "drafted" in stats
    n = len(tokens)
    extra: dict[str, Any] = {}
    if problem.category is not None:
        extra["category"] = problem.category
    if getattr(result, "turns", None):  # a conversation: each turn's prompt, text and tokens
        extra["turns"] = result.turns
    return {
        "id": problem.id,
        "index": problem.index,
        **extra,
        "mode": mode,
        "prompt": prompt,
        "prompt_tokens": len(prompt_ids),
        "generated_tokens": n,
        "text": text,
        "gold": problem.gold,
        "extracted": graded["extracted"],
        "extraction": graded["extraction"],
        "correct": graded["correct"],
        "stop_reason": result.stop_reason,
        "truncated": bool(getattr(result, "truncated", result.stop_reason == "length")),
        "time_s": seconds,
        "tokens_per_s": n / seconds if seconds > 0 else 0.0,
        "alpha": stats.get("alpha") if speculative else None,
        "tau": stats.get("tau") if speculative else None,
        "per_position_acceptance": stats.get("per_position_acceptance") if speculative else None,
        "output_acceptance": output_thirds(stats) if speculative else None,
        "predicted_speedup": stats.get("predicted_speedup") if speculative else None,
        "stats": stats,
        "config": dict(config),
        "shard": shard,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


@dataclass
class RunOutcome:
    """What a run did: records written now, records found from before, and whether it was cut short."""

    new: list[dict[str, Any]]
    previous: list[dict[str, Any]]
    interrupted: bool = False


def _postfix(records: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The progress bar's running numbers: accuracy per mode, alpha and tokens/s of the spec mode."""
    out: dict[str, str] = {}
    for mode in sorted({r["mode"] for r in records}, key=mode_key):
        rs = [r for r in records if r["mode"] == mode]
        graded = [r for r in rs if r["correct"] is not None]
        if graded:
            out[f"acc_{mode}"] = f"{sum(r['correct'] for r in graded) / len(graded):.2f}"
        tps = sum(r["generated_tokens"] for r in rs) / max(sum(r["time_s"] for r in rs), 1e-9)
        out[f"tok/s_{mode}"] = f"{tps:.1f}"
    spec = [r for r in records if r["mode"] == "spec" and r.get("stats")]
    drafted = sum(r["stats"].get("drafted", 0) for r in spec)
    if drafted:
        out["alpha"] = f"{sum(r['stats'].get('accepted', 0) for r in spec) / drafted:.2f}"
    return out


def problem_prompt(tokenizer: Tokenizer, problem: Problem, system_prompt: str | None) -> tuple[str, list[int]]:
    """The prompt text of a problem (chat template + reasoning instruction; a conversation's first turn: the chat
    template alone) and its token ids."""
    if problem.turns:
        prompt = conversation_prompt(tokenizer, problem.turns, [])
    else:
        prompt = build_prompt(tokenizer, problem.question, system_prompt)
    return prompt, list(tokenizer.encode(prompt))


@dataclass
class ConversationResult:
    """The turns of one conversation as one result: every turn's tokens, the summed time and counters."""

    tokens: list[int]
    stop_reason: str
    stats: dict[str, Any]
    turns: list[dict[str, Any]]
    truncated: bool


SUMMED = ("new_tokens", "drafted", "accepted", "target_tokens", "target_forwards", "draft_forwards", "rounds",
          "prefill_tokens", "time_prefill", "time_draft", "time_verify", "time_sample", "time_total", "lookup_rounds")
LOGS = ("round_emitted", "round_drafted", "round_accepted")


def combine_turns(stats: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One statistics dict for the turns of a conversation: counters and times summed, per-round logs joined,
    per-position acceptance pooled by judged counts, and alpha, tau and the rates derived again from the sums."""
    from minitorch.generation.stats import predicted_speedup

    out: dict[str, Any] = {k: sum(s.get(k, 0) for s in stats) for k in SUMMED if any(k in s for s in stats)}
    for k in LOGS:
        if all(k in s for s in stats):
            out[k] = [x for s in stats for x in s[k]]
    width = max((len(s.get("per_position_judged") or []) for s in stats), default=0)
    judged, accepted, hist = [0] * width, [0.0] * width, []
    for s in stats:
        for i, (j, a) in enumerate(zip(s.get("per_position_judged") or [], s.get("per_position_acceptance") or [])):
            judged[i] += j
            accepted[i] += a * j
        for i, h in enumerate(s.get("accept_length_hist") or []):
            hist += [0] * (i + 1 - len(hist))
            hist[i] += h
    total = out.get("time_total", 0.0)
    out["tokens_per_s"] = out.get("new_tokens", 0) / total if total else 0.0
    if "drafted" not in out:
        out["tau"] = 1.0 if out.get("target_forwards") else 0.0
        return out
    rounds, fw = out.get("rounds", 0), out.get("target_forwards", 0)
    token_acc = sum(accepted) / sum(judged) if sum(judged) else 0.0
    t_draft = out.get("time_draft", 0.0) / out["draft_forwards"] if out.get("draft_forwards") else 0.0
    t_target = out.get("time_verify", 0.0) / fw if fw else 0.0
    c = t_draft / t_target if t_target > 0 else 0.0
    mean_gamma = out["drafted"] / rounds if rounds else 0.0
    out.update(alpha=out["accepted"] / out["drafted"] if out["drafted"] else 0.0, token_acceptance=token_acc,
               tau=(out["new_tokens"] - out.get("prefill_tokens", 0)) / fw if fw else 0.0, mean_gamma=mean_gamma,
               per_position_acceptance=[a / j if j else 0.0 for a, j in zip(accepted, judged)],
               per_position_judged=judged, accept_length_hist=hist, cost_ratio_c=c,
               predicted_speedup=predicted_speedup(token_acc, mean_gamma, c) if rounds else 1.0)
    return out


def generate_conversation(problem: Problem, generate: GenerateFn, tokenizer: Tokenizer, max_new_tokens: int,
                          seed: int) -> ConversationResult:
    """Each user turn answered in order, the next turn's prompt holding the earlier turns and this mode's own
    answers to them (Spec-Bench's multi-turn setting); max_new_tokens a turn."""
    return run_job(conversation_job(problem, tokenizer, max_new_tokens, seed), generate)


def conversation_job(problem: Problem, tokenizer: Tokenizer, max_new_tokens: int, seed: int) -> Job:
    """generate_conversation as a job (batch.py): one request a turn, each built from the answers before it."""
    answers: list[str] = []
    turns: list[dict[str, Any]] = []
    results = []
    for i in range(len(problem.turns)):
        prompt = conversation_prompt(tokenizer, problem.turns, answers)
        ids = list(tokenizer.encode(prompt))
        res = yield (ids, max_new_tokens, seed)
        text = tokenizer.decode(list(res.tokens))
        answers.append(text)
        results.append(res)
        turns.append({"prompt_tokens": len(ids), "generated_tokens": len(res.tokens), "text": text,
                      "stop_reason": res.stop_reason})
    return ConversationResult(tokens=[t for r in results for t in r.tokens], stop_reason=results[-1].stop_reason,
                              stats=combine_turns([dict(getattr(r, "stats", None) or {}) for r in results]),
                              turns=turns, truncated=any(r.stop_reason == "length" for r in results))


def run_generation(problem: Problem, mode: str, generate: GenerateFn, tokenizer: Tokenizer, prompt: str,
                   prompt_ids: Sequence[int], config: Mapping[str, Any], max_new_tokens: int, seed: int,
                   shard: str) -> dict[str, Any]:
    """One (problem, mode) generation, timed, decoded and graded into its record; problem `index` offsets `seed`."""
    t0 = time.perf_counter()
    try:
        result = run_job(generation_job(problem, tokenizer, prompt_ids, max_new_tokens, seed), generate)
    except ValueError as e:  # e.g. prompt + max_new_tokens longer than the model's context
        raise BenchmarkError(f"problem {problem.id} ({mode}): {e}") from None
    return result_record(problem, mode, tokenizer, prompt, prompt_ids, result, time.perf_counter() - t0, config, shard)


def generation_job(problem: Problem, tokenizer: Tokenizer, prompt_ids: Sequence[int], max_new_tokens: int,
                   seed: int) -> Job:
    """A (problem, mode)'s generations as a job (batch.py): its prompt, or each turn of a conversation; problem
    `index` offsets `seed`. Returns the result (a ConversationResult for a conversation)."""
    if len(problem.turns) > 1:
        return (yield from conversation_job(problem, tokenizer, max_new_tokens, seed + problem.index))
    return (yield (list(prompt_ids), max_new_tokens, seed + problem.index))


def result_record(problem: Problem, mode: str, tokenizer: Tokenizer, prompt: str, prompt_ids: Sequence[int],
                  result: Any, seconds: float, config: Mapping[str, Any], shard: str) -> dict[str, Any]:
    """The record of a finished generation: its text decoded (a conversation's turns joined), graded."""
    text = ("\n\n".join(t["text"] for t in result.turns) if isinstance(result, ConversationResult)
            else tokenizer.decode(list(result.tokens)))
    return make_record(problem, mode, prompt, prompt_ids, result, text, seconds, config, shard)


def batch_records(todo: Sequence[tuple[Problem, str]], batch: BatchFn, tokenizer: Tokenizer,
                  config: Mapping[str, Any], max_new_tokens: int, seed: int, system_prompt: str | None,
                  shard: str) -> Iterator[dict[str, Any]]:
    """The records of the (problem, mode) pairs generated together (--batch N), each as it finishes (out of order).
    A record's time_s is its own generations' wall seconds from admission to end (summed over a conversation's
    turns): the batch's other sequences were decoded in the same steps, so its tokens/s is not a batch-1 figure."""
    prompts: dict[str, tuple[str, list[int]]] = {}
    problems = {(p.id, m): p for p, m in todo}

    def jobs() -> Iterator[tuple[Any, Job]]:
        for problem, mode in todo:
            if problem.id not in prompts:
                prompts[problem.id] = problem_prompt(tokenizer, problem, system_prompt)
            yield (problem.id, mode), generation_job(problem, tokenizer, prompts[problem.id][1], max_new_tokens, seed)

    try:
        for (pid, mode), result in run_jobs(jobs(), batch):
            prompt, ids = prompts[pid]
            seconds = float((getattr(result, "stats", None) or {}).get("time_total", 0.0))
            yield result_record(problems[(pid, mode)], mode, tokenizer, prompt, ids, result, seconds, config, shard)
    except ValueError as e:  # a request the batch cannot hold (it names the problem and mode)
        raise BenchmarkError(f"--batch: {e}") from None


def run_problem(problem: Problem, modes: Mapping[str, GenerateFn], order: Sequence[str], tokenizer: Tokenizer,
                config: Mapping[str, Any], max_new_tokens: int, *, seed: int = 0, system_prompt: str | None = None,
                shard: str = "0/1") -> list[dict[str, Any]]:
    """The records of one problem's modes in `order`, as the run loop writes them (the Ray workers' unit)."""
    prompt, prompt_ids = problem_prompt(tokenizer, problem, system_prompt)
    return [run_generation(problem, m, modes[m], tokenizer, prompt, prompt_ids, config, max_new_tokens, seed, shard)
            for m in order]


def plan_run(problems: Sequence[Problem], mode_names: Iterable[str], output: str | Path, config: Mapping[str, Any],
             max_new_tokens: int, resume: bool) -> tuple[list[dict[str, Any]], list[str], list[tuple[Problem, str]]]:
    """Check the flags and the results file: (records from before, modes in order, (problem, mode) pairs to run).

    A cut-off last line is repaired when resuming; other settings than the file's are refused.
    """
    if max_new_tokens < 1:
        raise BenchmarkError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    output = Path(output)
    previous = read_results(output, repair=resume)
    if previous and not resume:
        raise BenchmarkError(f"{output} already has {len(previous)} results; pass --resume to continue it "
                             "or choose another --output")
    check_config(previous, config, str(output))
    done = {(r["id"], r["mode"]) for r in previous}
    order = sorted(mode_names, key=mode_key)
    return previous, order, [(p, m) for p in problems for m in order if (p.id, m) not in done]


class Progress:
    """The run's tqdm bar (nothing when off): generations done of all, running accuracy, tokens/s and alpha."""

    def __init__(self, enabled: bool, problems: Sequence[Problem], order: Sequence[str], todo: Sequence[Any],
                 previous: Sequence[Mapping[str, Any]], desc: str) -> None:
        ids = {p.id for p in problems}
        self.shown = [r for r in previous if r["id"] in ids and r["mode"] in order]
        self.bar = None
        if enabled:
            from tqdm import tqdm
            total = len(problems) * len(order)
            self.bar = tqdm(total=total, initial=total - len(todo), desc=desc, unit="gen", dynamic_ncols=True)
            if self.shown:
                self.bar.set_postfix(_postfix(self.shown))

    def add(self, record: Mapping[str, Any]) -> None:
        self.shown.append(record)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(_postfix(self.shown))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def median_record(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One (problem, mode)'s record from its repeated runs: the run of median wall time (the lower of the middle two
    for an even count), whole, so its time splits and statistics are that run's; with every run's seconds
    (`time_s_runs`, in the order run) and whether every run wrote the same text (`repeats_identical`)."""
    by_time = sorted(range(len(runs)), key=lambda i: runs[i]["time_s"])
    rec = dict(runs[by_time[(len(runs) - 1) // 2]])
    rec["time_s_runs"] = [float(r["time_s"]) for r in runs]
    rec["repeats_identical"] = all(r["text"] == runs[0]["text"] for r in runs)
    return rec


def timed_records(todo: Sequence[tuple[Problem, str]], run: Callable[[Problem, str], dict[str, Any]],
                  repeats: int = 1) -> Iterator[dict[str, Any]]:
    """The records of the (problem, mode) pairs, one problem at a time, its modes in alternating order: problem k's
    (its `index`) r-th repetition runs them in `todo`'s order when k + r is even, reversed when odd, so neither mode
    always runs first (a machine whose speed drifts, or a first run that warms a cache, favours no mode). A problem's
    records are yielded when its runs are done, in `todo`'s order (an interrupted run loses at most the unfinished
    problem's); with repeats > 1 each is median_record of its runs."""
    groups: dict[str, tuple[Problem, list[str]]] = {}
    for problem, mode in todo:
        groups.setdefault(problem.id, (problem, []))[1].append(mode)
    for problem, pmodes in groups.values():
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in pmodes}
        for r in range(repeats):
            for mode in (pmodes if (problem.index + r) % 2 == 0 else pmodes[::-1]):
                runs[mode].append(run(problem, mode))
        yield from (runs[m][0] if repeats == 1 else median_record(runs[m]) for m in pmodes)


def run_benchmark(problems: Sequence[Problem], modes: Mapping[str, GenerateFn], tokenizer: Tokenizer,
                  output: str | Path, config: Mapping[str, Any], max_new_tokens: int, *,
                  resume: bool = False, seed: int = 0, system_prompt: str | None = None,
                  shard: str = "0/1", progress: bool = True, batch: BatchFn | None = None,
                  repeats: int = 1) -> RunOutcome:
    """Run every (problem, mode) not yet in `output`, appending one record as each finishes.

    `config` describes the settings (it is stored on every line and checked on resume). Problem
    `index` offsets `seed`, so a sharded run samples exactly what one run would. A KeyboardInterrupt
    stops the loop after the finished generations were written; the outcome says it was interrupted. batch
    (--batch N): the generations run together through it (batch_records), records written as each finishes.
    One at a time, a problem's modes alternate which runs first (timed_records); repeats N: each generation runs N
    times and its record is the median run's (median_record), written after the problem's N repetitions.
    """
    if repeats < 1:
        raise BenchmarkError(f"--repeats must be >= 1, got {repeats}")
    if repeats > 1 and batch is not None:
        raise BenchmarkError("--repeats times one generation at a time: not with --batch")
    if max_new_tokens < 1:
        raise BenchmarkError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    unknown = [m for m in modes if not callable(modes[m])]
    if unknown:
        raise BenchmarkError(f"mode {unknown[0]!r} has no generator")
    previous, order, todo = plan_run(problems, modes, output, config, max_new_tokens, resume)
    outcome = RunOutcome(new=[], previous=previous)
    bar = Progress(progress, problems, order, todo, previous, str(config.get("dataset", "bench")))
    prompts: dict[str, tuple[str, list[int]]] = {}

    def prompt_of(problem: Problem) -> tuple[str, list[int]]:
        if problem.id not in prompts:
            prompts[problem.id] = problem_prompt(tokenizer, problem, system_prompt)
        return prompts[problem.id]

    try:
        with ResultsWriter(output) as writer:
            for rec in (batch_records(todo, batch, tokenizer, config, max_new_tokens, seed, system_prompt, shard)
                        if batch is not None else
                        timed_records(todo, lambda problem, mode: run_generation(
                            problem, mode, modes[mode], tokenizer, *prompt_of(problem), config, max_new_tokens, seed,
                            shard), repeats)):
                writer.write(rec)
                outcome.new.append(rec)
                bar.add(rec)
    except KeyboardInterrupt:
        outcome.interrupted = True
    finally:
        bar.close()
    return outcome
