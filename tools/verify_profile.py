"""What a verify row costs on the GPU, kernel by kernel (issue 44): the target's step of T tokens as a replayed CUDA
graph for T = 1 ... 32 (median of 3 rounds of 5 x 30 replays), then one eager step at T = 1, 5, 13 and 32 with
events around every launch (project/bench/throughput.py profile_step), every kernel kind's microseconds summed over
the 28 layers. Random weights of the offline target's shapes (Qwen2.5-Coder-1.5B), gemv "tc" (the exact default),
the CLI's 32k-position cache at position 512. Steps of more than 16 tokens take cuBLAS and separate epilogue kernels
(not bit-equal to a decode step's rows: the tree and chain verify steps stay at 16 or fewer).

    python tools/verify_profile.py        (on a GPU machine; PYTHONPATH=. from the checkout)

One JSON line a row count (ms, and steps: over the one-token step), then one a profiled count (us by kernel).

    python tools/verify_profile.py --split-ab

instead times, in 3 interleaved rounds, the residual norm of steps of 1+, 2+ or 9+ tokens in its own kernel
(CudaDecoder.split_norm_from, gemv_resnorm_rows_bf16) against the resnorm epilogue's last block, each variant's
logits checked bit for bit against the epilogue's, then profiles the 2+ variant's 13-token step."""
import argparse
import json
import statistics
from types import SimpleNamespace

import numpy as np

from minitorch.cuda import decoder as decmod
from minitorch.cuda.runtime import cupy_or_exit

ROWS = [1, 2, 3, 5, 8, 9, 13, 16, 24, 32]
PROFILED = [1, 5, 13, 32]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--split-ab", action="store_true", help="the residual norm in its own kernel against the epilogue")
    args = ap.parse_args()
    cp = cupy_or_exit("tools/verify_profile.py")
    from project.bench import throughput

    cfg = SimpleNamespace(**throughput.SHAPES["qwen2.5-coder-1.5b"])
    dec = decmod.CudaDecoder(cfg, decmod.random_weights(cfg, seed=0), max_len=32768, max_tokens=max(ROWS), gemv="tc")
    dec.limit_vocab(dec.V)
    rng = np.random.default_rng(0)
    dec.set_position(0)
    dec.tokens[:max(ROWS)] = cp.asarray(rng.integers(0, 151665, max(ROWS)), dtype=dec.tokens.dtype)
    dec.replay(max(ROWS), all_logits=True, advance=False)  # a context for the timed steps to attend to
    dec.set_position(512)
    if args.split_ab:
        return split_ab(cp, dec, throughput)
    times = {T: [] for T in ROWS}
    for _ in range(3):
        for T in ROWS:
            times[T].append(throughput.time_graph(cp, dec, T, 30))
    one = statistics.median(times[1])
    for T in ROWS:
        ms = 1e3 * statistics.median(times[T])
        print(json.dumps(dict(rows=T, ms=round(ms, 4), steps=round(ms / 1e3 / one, 3))), flush=True)
    for T in PROFILED:
        prof = throughput.profile_step(cp, dec, T)
        print(json.dumps(dict(profile_rows=T, us_total=round(sum(prof.values()), 1),
                              us={k: round(v, 1) for k, v in prof.items()})), flush=True)
    return 0


def split_ab(cp, dec, throughput) -> int:
    """--split-ab: graph ms of each variant by rows (medians of 3 interleaved rounds), bits against the epilogue's."""
    rows = [T for T in ROWS if T <= 16]  # the exact path's steps
    variants = {"epilogue": None, "split9": 9, "split2": 2, "split1": 1}
    times = {(v, T): [] for v in variants for T in rows}
    ref, same = {}, True
    for rep in range(3):
        for v, start in variants.items():
            dec.split_norm_from = start
            dec.graphs.clear()
            for T in rows:
                times[(v, T)].append(throughput.time_graph(cp, dec, T, 30))
                if rep == 0:
                    bits = cp.asnumpy(dec.logits[:T]).view(np.uint32)
                    ref.setdefault(T, bits)
                    if not np.array_equal(ref[T], bits):
                        same = False
                        print(json.dumps(dict(variant=v, rows=T, same_bits=False)), flush=True)
    one = statistics.median(times[("epilogue", 1)])
    for v in variants:
        print(json.dumps(dict(variant=v, ms={T: round(1e3 * statistics.median(times[(v, T)]), 4) for T in rows},
                              steps={T: round(statistics.median(times[(v, T)]) / one, 3) for T in rows})), flush=True)
    print(json.dumps(dict(same_bits=same)), flush=True)
    dec.split_norm_from = 2
    dec.graphs.clear()
    prof = throughput.profile_step(cp, dec, 13)
    print(json.dumps(dict(variant="split2", profile_rows=13, us_total=round(sum(prof.values()), 1),
                          us={k: round(v, 1) for k, v in prof.items()})), flush=True)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
