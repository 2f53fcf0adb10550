"""Command line shared by benchmark_gsm8k.py and benchmark_limo.py.

    python project/benchmark_gsm8k.py [run flags]                     run (or --resume) a benchmark
    python project/benchmark_gsm8k.py --ray [ADDRESS] [run flags]     the same on Ray workers (distributed.py)
    python project/benchmark_gsm8k.py merge -o all.jsonl a.jsonl b.jsonl   join shard files
    python project/benchmark_gsm8k.py summary all.jsonl               table + JSON + plots of a file

A user mistake ends with one line on stderr and exit status 2; Ctrl-C or SIGTERM ends with every
finished generation kept and exit status 130.
"""
from __future__ import annotations

import argparse
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from project.one_line_parser import OneLineParser
from project.settings import add_batch_args

from .data import (REASONING_INSTRUCTION, BenchmarkError, data_stem, load_problems, parse_shard, select_categories,
                   select_problems)
from .distributed import add_ray_args, check_ray_args, run_on_ray
from .engine import Engine, add_engine_args, load_engine
from .runner import MODE_ORDER, merge_results, read_results, run_benchmark
from .summary import format_table, summarize, write_summary

HF_MODES = ("hf_greedy", "hf_assisted")


@dataclass(frozen=True)
class BenchSpec:
    """What differs between the GSM8K and LIMO programs."""

    name: str
    datasets: tuple[str, ...]
    default_dataset: str
    default_max_new_tokens: int
    description: str
    categories: bool = False  # the data has categories (Spec-Bench): --category, --per-category


EngineFactory = Callable[[argparse.Namespace, Sequence[str]], Engine]


def build_parser(bench: BenchSpec) -> argparse.ArgumentParser:
    """The run command's flags (dataset, slicing, modes, output, models, sampling)."""
    p = OneLineParser(
        prog=f"benchmark_{bench.name}.py", description=bench.description,
        epilog=f"Other commands: 'benchmark_{bench.name}.py merge -o OUT IN...' joins shard files; "
               f"'benchmark_{bench.name}.py summary FILE' prints the table and writes JSON and plots.")
    d = p.add_argument_group("data")
    d.add_argument("--dataset", default=bench.default_dataset, choices=bench.datasets,
                   help=f"dataset name (default {bench.default_dataset}; local copy under --data-dir)")
    d.add_argument("--data-file", default=None, help="a .jsonl/.json file of problems (question/problem + answer) instead")
    d.add_argument("--data-dir", default=None, help="the data folder (default the repository's data/, "
                   "or $MINITORCH_SPEC_DATA)")
    d.add_argument("--hub", action="store_true", help="load the dataset from the Hugging Face hub (needs 'datasets')")
    d.add_argument("--offset", type=int, default=0, help="skip this many problems first (default 0)")
    d.add_argument("--limit", type=int, default=None, help="run at most this many problems (default all)")
    d.add_argument("--shard", default="0/1", help="i/n: run every n-th problem starting at i (after offset/limit), "
                   "so n processes can split a run; join their files with 'merge'")
    if bench.categories:
        d.add_argument("--category", default=None, metavar="CAT[,CAT]",
                       help="only these categories (comma list; default all), before --offset/--limit")
        d.add_argument("--per-category", type=int, default=None, metavar="N",
                       help="the first N questions of each category (default all), before --offset/--limit")
    r = p.add_argument_group("run")
    r.add_argument("--modes", default=None, help="comma list of spec,target (default both, per problem; with --batch "
                   "N > 1 target, the one mode a batch runs)")
    r.add_argument("--system-prompt", action="store_true",
                   help="put the reasoning instruction in a system turn (LIMO eval style) instead of after the question")
    r.add_argument("--output", "-o", default=None,
                   help=f"results JSONL (default results/{bench.name}/<dataset>[.shard-i-of-n].jsonl)")
    r.add_argument("--resume", action="store_true", help="continue an existing results file, skipping finished problems")
    r.add_argument("--compare-hf", action="store_true",
                   help="also run transformers greedy and assisted generation on the same prompts (needs torch)")
    r.add_argument("--repeats", type=int, default=1, metavar="N",
                   help="time each generation N times, a problem's modes alternating which runs first, and keep the "
                        "median run's record (of an even count the faster of the middle two: of 2, the faster; "
                        "every run's seconds in time_s_runs): per-problem speedups on a machine whose speed drifts "
                        "(default 1; one at a time, not with --batch or --ray)")
    r.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_batch_args(r)
    add_engine_args(p, bench.default_max_new_tokens)
    add_ray_args(p)
    return p


def parse_modes(text: str | None, batch: int = 1) -> list[str]:
    """--modes as a list in MODE_ORDER (default spec,target; target with --batch N > 1, the only mode a batch runs)."""
    if text is None:
        text = "target" if batch > 1 else "spec,target"
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in ("spec", "target")]
    if not modes or bad:
        raise BenchmarkError(f"--modes takes a comma list of spec,target; got {text!r}")
    if batch > 1 and modes != ["target"]:
        raise BenchmarkError(f"--batch {batch} decodes the target alone: run it with --modes target (speculative "
                             "decoding runs one sequence at a time, and a speedup over a batch's per-sequence tokens/s "
                             "would mean nothing)")
    return sorted(set(modes), key=MODE_ORDER.index)


def default_output(bench: BenchSpec, args: argparse.Namespace, shard: tuple[int, int]) -> Path:
    stem = data_stem(args.data_file) if args.data_file else args.dataset
    suffix = f".shard-{shard[0]}-of-{shard[1]}" if shard[1] > 1 else ""
    return Path("results") / bench.name / f"{stem}{suffix}.jsonl"


def report(records: list[dict[str, Any]], output: Path, plots: bool) -> None:
    """Print the summary table; write <stem>.summary.json and <stem>_plots/*.png beside output (stem: its name less
    .gz and .jsonl, so a compressed run's summary sits where its uncompressed run's would)."""
    if not records:
        print(f"{output}: no results yet")
        return
    summary = summarize(records)
    print(format_table(summary))
    stem = output.parent / data_stem(output)
    js = write_summary(summary, Path(f"{stem}.summary.json"))
    print(f"summary: {js}")
    if plots:
        from .plots import make_plots  # matplotlib only when plotting

        for png in make_plots(records, summary, Path(f"{stem}_plots")):
            print(f"plot: {png}")


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def run_main(bench: BenchSpec, argv: Sequence[str], engine_factory: EngineFactory | None = None) -> int:
    """Parse flags, load problems and models, run, summarize. Returns the exit status."""
    args = build_parser(bench).parse_args(argv)
    from project.settings import resolve_settings

    check_ray_args(args)
    resolve_settings(args)  # every engine flag checked before any problem or model loads (load_engine resolves again)
    modes = parse_modes(args.modes, args.batch)
    if args.repeats < 1:
        raise BenchmarkError(f"--repeats must be >= 1, got {args.repeats}")
    if args.repeats > 1 and (args.batch > 1 or args.ray is not None):
        raise BenchmarkError(f"--repeats {args.repeats} times one generation at a time in this process: not with "
                             f"{'--batch' if args.batch > 1 else '--ray'}")
    if args.batch > 1 and (args.compare_hf or args.ray is not None):
        raise BenchmarkError(f"--batch {args.batch} runs the target's batch in this process: not with "
                             f"{'--compare-hf' if args.compare_hf else '--ray'}")
    shard = parse_shard(args.shard)
    problems = load_problems(None if args.data_file else args.dataset, args.data_file, args.data_dir, args.hub)
    if bench.categories:
        problems = select_categories(problems, args.category, args.per_category)
    problems = select_problems(problems, args.offset, args.limit, shard)
    output = Path(args.output) if args.output else default_output(bench, args, shard)
    previous = read_results(output)  # fail early (before loading models) on a bad or foreign file
    if previous and not args.resume:
        raise BenchmarkError(f"{output} already has {len(previous)} results; pass --resume to continue it "
                             "or choose another --output")
    all_modes = modes + (list(HF_MODES) if args.compare_hf else [])
    base = {"benchmark": bench.name, "dataset": str(args.data_file or args.dataset),
            "max_new_tokens": args.max_new_tokens, "system_prompt": bool(args.system_prompt)}
    if args.repeats > 1:  # only when on, so earlier result files still resume
        base["repeats"] = args.repeats
    if args.ray is not None:  # the models load in the Ray workers (distributed.py), each adding its engine's config
        old_handler = signal.signal(signal.SIGTERM, _sigterm)
        try:
            outcome = run_on_ray(args, problems, all_modes, output, base, engine_factory or load_engine,
                                 system_prompt=_system_prompt(args), progress=not args.no_progress)
        finally:
            signal.signal(signal.SIGTERM, old_handler)
        return _finish(outcome, output, args)
    engine = (engine_factory or load_engine)(args, all_modes)
    if args.batch > 1 and engine.batch is None:
        raise BenchmarkError(f"--batch {args.batch}: this engine generates one sequence at a time")
    config = {**base, **engine.config}
    gens = {m: engine.modes[m] for m in all_modes}
    old_handler = signal.signal(signal.SIGTERM, _sigterm)
    try:
        outcome = run_benchmark(problems, gens, engine.tokenizer, output, config, args.max_new_tokens,
                                resume=args.resume, seed=engine.config.get("seed", 0),
                                system_prompt=_system_prompt(args), shard=args.shard,
                                progress=not args.no_progress, batch=engine.batch if args.batch > 1 else None,
                                repeats=args.repeats)
    finally:
        signal.signal(signal.SIGTERM, old_handler)
    return _finish(outcome, output, args)


def _finish(outcome: Any, output: Path, args: argparse.Namespace) -> int:
    """After a run: say what was kept (exit 130 when interrupted) or print the summary (exit 0)."""
    records = read_results(output)
    if outcome.interrupted:
        print(f"interrupted: {len(outcome.new)} generations finished in this run; {len(records)} in total kept "
              f"in {output}; rerun with --resume to continue", file=sys.stderr)
        return 130
    print(f"{len(outcome.new)} new generations, {len(outcome.previous)} from before; results: {output}")
    report(records, output, plots=not args.no_plots)
    return 0


def _system_prompt(args: argparse.Namespace) -> str | None:
    return REASONING_INSTRUCTION if args.system_prompt else None


def merge_main(bench: BenchSpec, argv: Sequence[str]) -> int:
    p = OneLineParser(prog=f"benchmark_{bench.name}.py merge",
                                description="Join shard result files (same settings) into one, then summarize it.")
    p.add_argument("inputs", nargs="+", help="shard JSONL files")
    p.add_argument("--output", "-o", required=True, help="the merged JSONL file to write")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    args = p.parse_args(argv)
    merged = merge_results(args.inputs, args.output)
    print(f"merged {len(args.inputs)} files: {len(merged)} generations -> {args.output}")
    report(merged, Path(args.output), plots=not args.no_plots)
    return 0


def summary_main(bench: BenchSpec, argv: Sequence[str]) -> int:
    p = OneLineParser(prog=f"benchmark_{bench.name}.py summary",
                                description="Print the summary table of a results file; write its JSON and plots.")
    p.add_argument("results", help="a results JSONL file")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    args = p.parse_args(argv)
    path = Path(args.results)
    if not path.is_file():
        raise BenchmarkError(f"results file not found: {path}")
    report(read_results(path), path, plots=not args.no_plots)
    return 0


def main(bench: BenchSpec, argv: Sequence[str] | None = None, engine_factory: EngineFactory | None = None) -> int:
    """Entry point of both benchmark programs: dispatch to run / merge / summary; user errors -> exit 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "merge":
            return merge_main(bench, argv[1:])
        if argv and argv[0] == "summary":
            return summary_main(bench, argv[1:])
        return run_main(bench, argv, engine_factory)
    except KeyboardInterrupt:  # during loading, before the run loop
        print("interrupted", file=sys.stderr)
        return 130
    except ValueError as e:  # BenchmarkError, ModelLoadError, generation ValueErrors: user mistakes
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"error: {msg}", file=sys.stderr)
        return 2
    except OSError as e:  # unreadable / unwritable files
        print(f"error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 2
