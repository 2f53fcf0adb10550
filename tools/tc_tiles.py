"""Step cost of the tensor-core GEMV's weight tiles (minitorch/cuda/decoder.py tc_tiles) for steps of 1 to 16 tokens:
the target's decode and verify steps (chain: 5 rows at gamma 4; trees: up to 16) under several tile rules, on
random-weight Qwen2.5-Coder-1.5B shapes at the CLI's 32k-position cache, gemv "tc" (the exact default), in one
process, the rules interleaved in REPS rounds (the machine's state drifts; the medians of the rounds are printed).
Each rule's T-token step logits are checked against the first rule's, bit for bit (the tiles change no bit).

    python tools/tc_tiles.py [--rows 1 5 8 9 13 16] [--reps 3] [--profile 13]    (tools/gpu.sh tc-tiles)

One JSON line per rule and row count: ms a step, and its cost in one-token steps of the first rule; with
--profile T, each rule's GPU microseconds per product at T tokens (eager, events around each launch)."""
import argparse
import json
import statistics
from types import SimpleNamespace

import numpy as np

from minitorch.cuda import decoder as decmod
from minitorch.cuda.launch import WIDE_ROWS

RULES = {  # (M tokens, N rows, K inputs) -> weight tiles of 8 rows a block
    "wide8k": lambda M, N, K: 2 if N > WIDE_ROWS else 1,  # the rule before tools/tc_tiles.py
    "default": decmod.tc_tiles,  # this tree's
    "w_over8": lambda M, N, K: 2 if N > WIDE_ROWS or M > 8 else 1,
    "w_from5": lambda M, N, K: 2 if N > WIDE_ROWS or M >= 5 else 1,
}  # 4 tiles (32 rows a block, gemvtc*x) were slower still: they lived in commit 06e8c58 (docs/results/h100_tc_tiles/)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 5, 8, 9, 13, 16])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rules", nargs="+", default=[r for r in RULES if r != "default"], choices=list(RULES))
    ap.add_argument("--profile", type=int, default=0, help="also profile each rule's products at this many tokens")
    args = ap.parse_args()
    from minitorch.cuda.runtime import cupy_or_exit

    cp = cupy_or_exit("tools/tc_tiles.py")
    from project.bench import throughput

    cfg = SimpleNamespace(**throughput.SHAPES["qwen2.5-coder-1.5b"])
    dec = decmod.CudaDecoder(cfg, decmod.random_weights(cfg, seed=0), max_len=32768, max_tokens=16, gemv="tc")
    dec.limit_vocab(dec.V)
    rng = np.random.default_rng(0)
    dec.set_position(0)
    dec.tokens[:16] = cp.asarray(rng.integers(0, 151665, 16), dtype=dec.tokens.dtype)
    dec.replay(16, all_logits=True, advance=False)  # a context for the timed steps to attend to
    dec.set_position(512)
    times = {(r, T): [] for r in args.rules for T in args.rows}
    ref = {}
    for rep in range(args.reps):
        for rule in args.rules:
            decmod.tc_tiles = RULES[rule]
            dec.graphs.clear()
            for T in args.rows:
                times[(rule, T)].append(throughput.time_graph(cp, dec, T, 30))
                if rep == 0:
                    logits = cp.asnumpy(dec.logits[:T]).view(np.uint32)
                    ref.setdefault(T, logits)
                    if not np.array_equal(ref[T], logits):
                        print(json.dumps(dict(rule=rule, rows=T, same_bits=False)), flush=True)
                        return 1
    decmod.tc_tiles = RULES["default"]
    base = args.rules[0]
    one = statistics.median(times[(base, 1)]) if 1 in args.rows else None
    for rule in args.rules:
        for T in args.rows:
            ms = 1e3 * statistics.median(times[(rule, T)])
            print(json.dumps(dict(rule=rule, rows=T, ms=round(ms, 4), steps=round(ms / (1e3 * one), 3) if one else None,
                                  rounds=[round(1e3 * t, 4) for t in times[(rule, T)]], same_bits=True)), flush=True)
    if args.profile:
        for rule in args.rules:
            decmod.tc_tiles = RULES[rule]
            prof = throughput.profile_step(cp, dec, args.profile)
            gemv = {k: round(v, 1) for k, v in prof.items() if k.startswith("gemv")}
            print(json.dumps(dict(rule=rule, rows=args.profile, us_total=round(sum(prof.values()), 1), gemv_us=gemv)),
                  flush=True)
        decmod.tc_tiles = RULES["default"]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
