"""Device probe (issue 14): where the attention's share of a step goes. Times the coder 0.5B draft's
one-token step graph (CUDA-core GEMV) and the 1.5B target's 1- and 5-token step graphs (tensor-core
GEMV), random weights, 32k caches, 256 cached tokens; run once per kernel build / setting:
    PYTHONPATH=. [MINITORCH_CUDA_BUILD_DIR=dir] python3 tools/attn_probe.py LABEL [--kb N] [--attn split|cluster]
        [--slots N] [--ctx N] [--generic]
(build dirs with -DATT_STOP=1/2/3 give the cost of an empty attn_partial, of one that stops after
loading q and the position, of an empty attn_combine; kernels/attention.cu)."""
import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

import minitorch.cuda.decoder as decoder_mod
from minitorch.cuda.decoder import CudaDecoder, random_weights

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "project" / "bench"))
import throughput  # noqa: E402  (the bench's shapes and graph timer)


def main() -> None:
    from minitorch.cuda.runtime import cupy_or_exit

    cp = cupy_or_exit("tools/attn_probe.py")

    ap = argparse.ArgumentParser()
    ap.add_argument("label")
    ap.add_argument("--kb", type=int, default=None)
    ap.add_argument("--attn", default="split")
    ap.add_argument("--slots", type=int, default=None, help="ATT_SLOT_BLOCKS and ATT_MIN_SLOTS")
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--generic", action="store_true", help="the generic attn_partial_bf16, not the compact one")
    a = ap.parse_args()
    if a.slots:
        decoder_mod.ATT_SLOT_BLOCKS = decoder_mod.ATT_MIN_SLOTS = a.slots
    row = []
    for shape, gemv, Ts in (("qwen2.5-coder-0.5b", "ours", (1,)), ("qwen2.5-coder-1.5b", "tc", (1, 5))):
        cfg = SimpleNamespace(**throughput.SHAPES[shape])
        dec = CudaDecoder(cfg, random_weights(cfg, seed=0), max_len=32768, max_tokens=16, gemv=gemv,
                          attn_kb=a.kb, attn=a.attn)
        if a.generic:
            dec.attn_partial = "attn_partial_bf16"
        dec.prefill([int(x) for x in np.random.default_rng(0).integers(0, cfg.vocab_size, a.ctx)])
        for T in Ts:
            row.append(f"{shape.split('-')[-1]} T={T} {throughput.time_graph(cp, dec, T) * 1e3:.3f} ms")
        del dec
    print(f"{a.label:28s} ctx {a.ctx}: " + " | ".join(row), flush=True)


if __name__ == "__main__":
    main()
