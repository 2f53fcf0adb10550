"""Device diagnostic (issue 14): where a persistent step's time goes (kernels/persistent.cu), phase by phase.
Needs a build with -DPT_TIMING=1 (block 0 writes %globaltimer after every grid barrier):
    MINITORCH_CUDA_BUILD_DIR=<that build> PYTHONPATH=. python3 tools/pt_phases.py
Random weights of the coder 0.5B shape, a 32k cache, 256 tokens of context; medians of 30 steps, in us."""
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from minitorch.cuda.decoder import CudaDecoder, random_weights

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "project" / "bench"))
import throughput  # noqa: E402  (the bench's shapes and graph timer)

KINDS = ("qkv", "attention", "merge", "o", "gate/up", "down")


def main() -> None:
    from minitorch.cuda.runtime import cupy_or_exit

    cp = cupy_or_exit("tools/pt_phases.py")

    cfg = SimpleNamespace(**throughput.SHAPES["qwen2.5-coder-0.5b"])
    dec = CudaDecoder(cfg, random_weights(cfg, seed=0), max_len=32768, max_tokens=128, gemv="ours", persistent=True)
    dec.prefill([int(x) for x in np.random.default_rng(0).integers(0, cfg.vocab_size, 256)])
    p, L = int(dec.pos.get()[0]), dec.L
    for T in (1, 2):
        rows = []
        for _ in range(30):
            dec.set_position(p)
            dec.replay(T, all_logits=False, advance=False)
            dec.stream.synchronize()
            marks = dec.pt_bar[8:9 + 6 * L].get().astype(np.int64)
            rows.append(np.diff(marks) % 2 ** 32)
        d = np.median(np.array(rows), axis=0).reshape(L, 6) / 1e3
        dec.set_position(p)
        step = throughput.time_graph(cp, dec, T) * 1e6
        parts = ", ".join(f"{k} {d[:, i].mean():.2f}" for i, k in enumerate(KINDS))
        print(f"T={T}: step graph {step:.0f} us (with the LM head); layers {d.sum():.0f} us = {L} x {d.sum() / L:.1f}: "
              f"per layer {parts}; failed={dec.persistent_failed()}")


if __name__ == "__main__":
    main()
