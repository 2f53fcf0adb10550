"""CPU speed report for speculative decoding: our target-alone vs our speculative decoding (model drafter
over a gamma list, and the n-gram drafter), greedy, on the first N GSM8K test questions, offline pair.

    python project/bench/cpu_spec.py --n 3 --max-new-tokens 128 --gammas 3,4,5,6
    python project/bench/cpu_spec.py --n 3 --compare-hf --json out.json

Per question and run it prints tok/s, speedup over our target-alone, alpha (draft acceptance), tau
(tokens per target forward) and whether the tokens are identical to target-alone (greedy must be).
The summary is aggregate tokens / aggregate seconds per run. --compare-hf then frees our models and runs
transformers target-alone and assisted generation (fp32, from the same GGUF files) on the same prompt
ids. The 1-minute load average is printed at start and end: the machine is shared, so read the numbers
next to it.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm

from minitorch.generation import SamplingConfig
from minitorch.generation.engine import DrafterSpec, make_engine
from project.cli_common import encode_prompt, load_models
from project.settings import Settings

ROOT = Path(__file__).resolve().parents[2]

DEFAULT_DATA = ROOT / "data" / "gsm8k" / "test.jsonl"
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"


def int_list(ap: argparse.ArgumentParser, flag: str, text: str, minimum: int) -> list[int]:
    """Comma-separated integers >= minimum, at least one; ap.error (exit 2) otherwise."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        ap.error(f"{flag} must be comma-separated integers, got {text!r}")
    if not values or min(values) < minimum:
        ap.error(f"{flag} needs at least one integer, all >= {minimum}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=3, help="number of GSM8K test questions (from --offset)")
    ap.add_argument("--offset", type=int, default=0, help="index of the first question")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per generation")
    ap.add_argument("--gammas", default="3,4,5,6", help="comma-separated draft lengths for the model drafter")
    ap.add_argument("--ngram", action=argparse.BooleanOptionalAction, default=True,
                    help="also run the n-gram drafter (at the first gamma)")
    ap.add_argument("--adaptive", action="store_true", help="adaptive gamma in speculative runs")
    ap.add_argument("--extends", default="0",
                    help="comma-separated prompt-lookup tokens after the model's drafts (--draft-extend), 0 = off")
    ap.add_argument("--draft-vocabs", default="0",
                    help="comma-separated --draft-vocab values to run for every gamma (0 = whole vocabulary)")
    ap.add_argument("--target", default=TARGET, help="target model (registry name or path)")
    ap.add_argument("--draft", default=DRAFT, help="draft model (registry name or path)")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="GSM8K test.jsonl")
    ap.add_argument("--compare-hf", action="store_true",
                    help="also run transformers target-alone and assisted generation (needs torch)")
    ap.add_argument("--hf-gamma", type=int, default=None, help="assistant tokens for HF (default: first gamma)")
    ap.add_argument("--no-skinny", action="store_true",
                    help="route every matmul to np.matmul (the FastOps behaviour before the skinny kernel)")
    ap.add_argument("--json", type=Path, default=None, help="write per-question rows and the summary here")
    args = ap.parse_args(argv)
    args.gamma_list = int_list(ap, "--gammas", args.gammas, minimum=1)
    args.draft_vocab_list = int_list(ap, "--draft-vocabs", args.draft_vocabs, minimum=0)
    args.extend_list = int_list(ap, "--extends", args.extends, minimum=0)
    if args.n < 1 or args.max_new_tokens < 1:
        ap.error("--n and --max-new-tokens must be >= 1")
    if not args.data.is_file():
        ap.error(f"no GSM8K file at {args.data}")
    return args


def questions(path: Path, offset: int, n: int) -> list[str]:
    out = []
    with open(path) as f:
        for i, line in enumerate(f):
            if i >= offset + n:
                break
            if i >= offset:
                out.append(json.loads(line)["question"] + "\n" + INSTRUCTION)
    return out


def loadavg() -> float:
    return round(os.getloadavg()[0], 2)


def record(rows: list[dict[str, Any]], q: int, run: str, tokens: list[int], seconds: float,
           stats: dict[str, Any], ref: list[int] | None) -> dict[str, Any]:
    row = {"q": q, "run": run, "n_tokens": len(tokens), "seconds": round(seconds, 3),
           "tok_s": round(len(tokens) / seconds, 3) if seconds > 0 else None,
           "alpha": stats.get("alpha"), "tau": stats.get("tau"), "target_forwards": stats.get("target_forwards"),
           "accepted": stats.get("accepted"), "drafted": stats.get("drafted"),
           "identical": None if ref is None else tokens == ref,
           **{k: round(stats[k], 3) for k in ("time_prefill", "time_draft", "time_verify") if stats.get(k) is not None},
           "tokens": tokens}
    rows.append(row)
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per run: aggregate tok/s, speedup vs our target-alone, alpha, tau, all-identical."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        a = out.setdefault(r["run"], {"tokens": 0, "seconds": 0.0, "acc": 0, "dr": 0, "fw": 0, "identical": True})
        a["tokens"] += r["n_tokens"]
        a["seconds"] += r["seconds"]
        a["acc"] += r["accepted"] or 0
        a["dr"] += r["drafted"] or 0
        a["fw"] += r["target_forwards"] or 0
        if r["identical"] is False:
            a["identical"] = False
    base = out.get("ours_target")
    for a in out.values():
        a["tok_s"] = a["tokens"] / a["seconds"] if a["seconds"] else None
        a["alpha"] = a["acc"] / a["dr"] if a["dr"] else None
        a["tau"] = a["tokens"] / a["fw"] if a["fw"] else None
        a["speedup"] = a["tok_s"] / base["tok_s"] if base and a["tok_s"] and base["tok_s"] else None
    return out


def fmt(row: dict[str, Any], base_tps: float | None) -> str:
    s = f"q{row['q']:<3} {row['run']:<16} {row['n_tokens']:>4} tok {row['tok_s'] or 0:7.2f} tok/s"
    if base_tps and row["tok_s"]:
        s += f"  speedup {row['tok_s'] / base_tps:5.2f}x"
    if row["alpha"] is not None:
        s += f"  alpha {row['alpha']:.3f}  tau {row['tau']:.2f}"
    if row["identical"] is not None:
        s += f"  identical {row['identical']}"
    return s


def run_ours(args: argparse.Namespace, prompts: list[str], rows: list[dict[str, Any]]) -> list[list[int]]:
    """Our runs on every prompt; returns the prompt ids (for the HF comparison)."""
    cfg = SamplingConfig()
    m = load_models(Settings(target=args.target, draft=args.draft, drafter="model", backend="cpu", dtype="float32",
                             gamma=args.gamma_list[0], extend=0, sampling=cfg), progress=False)

    def engine(kind: str, g: int = 1, dv: int = 0, x: int = 0) -> Any:
        """x > 0: the model's g drafts continued by up to x prompt-lookup tokens; dv: --draft-vocab."""
        spec = DrafterSpec(kind, model=m.draft if kind == "model" else None, gamma=g, extend=x, propose_vocab=dv,
                           adaptive=args.adaptive)
        return make_engine(m.target, spec, cfg, m.stop_ids, m.vocab_size)

    for g in args.gamma_list:  # every round shape the timed runs use (each row count compiles its kernels once)
        for x in args.extend_list:
            engine("model", g, 0, x).warm_up()
    args.stop_ids = sorted(m.stop_ids)
    all_ids = []
    runs: list[tuple[str, Callable[[list[int]], Any]]] = [
        ("ours_target", lambda ids, e=engine("none"): e.generate(ids, args.max_new_tokens))]
    for g in args.gamma_list:
        for dv in args.draft_vocab_list:
            for x in args.extend_list:
                runs.append((f"ours_spec_g{g}" + (f"_v{dv}" if dv else "") + (f"_x{x}" if x else ""),
                             lambda ids, e=engine("model", g, dv, x): e.generate(ids, args.max_new_tokens)))
    if args.ngram:
        g0 = args.gamma_list[0]
        runs.append((f"ours_ngram_g{g0}", lambda ids, e=engine("ngram", g0): e.generate(ids, args.max_new_tokens)))
    bar = tqdm(total=len(prompts) * len(runs), desc="ours", file=sys.stderr)
    for qi, text in enumerate(prompts):
        ids = encode_prompt(m.tokenizer, text, True)
        all_ids.append(ids)
        ref, base_tps = None, None
        for name, fn in runs:
            t0 = time.perf_counter()
            res = fn(ids)
            secs = res.stats.get("time_total", time.perf_counter() - t0)
            row = record(rows, args.offset + qi, name, list(res.tokens), secs, res.stats, ref)
            if name == "ours_target":
                ref, base_tps = list(res.tokens), row["tok_s"]
            tqdm.write(fmt(row, base_tps), file=sys.stdout)
            bar.update(1)
    bar.close()
    del m, runs
    gc.collect()
    return all_ids


def run_hf(args: argparse.Namespace, all_ids: list[list[int]], rows: list[dict[str, Any]]) -> None:
    """transformers target-alone and assisted generation on the same prompt ids (our target-alone tokens
    are the reference for the identical check)."""
    try:
        from project.evaluation.hf import hf_generators
        gens = hf_generators(args.target, args.draft, SamplingConfig(), args.stop_ids,
                             gamma=args.hf_gamma or args.gamma_list[0])
    except Exception as e:  # torch/transformers missing or the GGUF load failed: say so, keep our numbers
        print(f"--compare-hf skipped: {type(e).__name__}: {e}")
        return
    refs = {r["q"]: r["tokens"] for r in rows if r["run"] == "ours_target"}
    bar = tqdm(total=2 * len(all_ids), desc="transformers", file=sys.stderr)
    for qi, ids in enumerate(all_ids):
        q = args.offset + qi
        base_tps = None
        for name in ("hf_greedy", "hf_assisted"):
            t0 = time.perf_counter()
            res = gens[name](ids, args.max_new_tokens, 0)
            secs = time.perf_counter() - t0
            row = record(rows, q, name.replace("hf_greedy", "hf_target"), res.tokens, secs, {}, refs.get(q))
            base_tps = base_tps or row["tok_s"]
            tqdm.write(fmt(row, base_tps), file=sys.stdout)
            bar.update(1)
    bar.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.no_skinny:
        from minitorch.cpu import matmul as fast_matmul
        fast_matmul.SKINNY_MAX_ROWS = 0
    prompts = questions(args.data, args.offset, args.n)
    load0 = loadavg()
    print(f"# {len(prompts)} GSM8K questions x {args.max_new_tokens} tokens, greedy; loadavg {load0}", flush=True)
    rows: list[dict[str, Any]] = []
    all_ids = run_ours(args, prompts, rows)
    if args.compare_hf:
        run_hf(args, all_ids, rows)
    summary = summarize(rows)
    load1 = loadavg()
    print(f"== summary (aggregate tokens / aggregate seconds); loadavg start {load0} end {load1} ==")
    for name, a in summary.items():
        line = f"{name:<16} {a['tok_s'] or 0:7.2f} tok/s"
        if a["speedup"] is not None:
            line += f"  speedup {a['speedup']:5.2f}x"
        if a["alpha"] is not None:
            line += f"  alpha {a['alpha']:.3f}  tau {a['tau']:.2f}"
        line += f"  identical {a['identical']}"
        print(line)
    spec = {k: v for k, v in summary.items() if k.startswith("ours_spec_") and v["tok_s"]}
    if spec:
        best = max(spec, key=lambda k: spec[k]["tok_s"])
        print(f"best gamma: {best.rsplit('g', 1)[1]} ({spec[best]['tok_s']:.2f} tok/s)")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "loadavg": [load0, load1],
                                         "rows": rows, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
