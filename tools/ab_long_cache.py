"""Device A/B helper (issue 14): decode step, 5-token verify step and engine tokens/s of random-weight
Qwen2.5-Coder shapes (tied embeddings) at a short cache and at the CLI's 32k-position cache. Uses only
APIs present before and after the attention change, so the same file times both trees:
    PYTHONPATH=<tree> python3 tools/ab_long_cache.py LABEL
Prints one JSON line per (shape, gemv, max_len)."""
import json
import sys
from pathlib import Path

import numpy as np

from minitorch.cuda.decoder import CudaDecoder, random_weights
from minitorch.generation.cuda import generate_cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "project" / "bench"))
import throughput  # noqa: E402  (this checkout's bench: its shapes and its graph timer)

SHAPES = {"coder-1.5b": throughput.SHAPES["qwen2.5-coder-1.5b"], "coder-0.5b": throughput.SHAPES["qwen2.5-coder-0.5b"]}


def time_graph(cp, dec, T, reps=30):
    """Milliseconds of one replay of the T-token step graph (the bench's time_graph, in ms)."""
    return 1e3 * throughput.time_graph(cp, dec, T, reps)


def main():
    from minitorch.cuda.runtime import cupy_or_exit

    cp = cupy_or_exit("tools/ab_long_cache.py")

    label = sys.argv[1]
    prompt = [int(x) for x in np.random.default_rng(0).integers(0, 151665, 128)]
    for name, kw in SHAPES.items():
        cfg = SimpleNamespace(**kw)
        w = random_weights(cfg, seed=0)
        for gemv in (["ours", "ours1"] if name == "coder-1.5b" else ["ours"]):
            for max_len in (400, 32768):
                dec = CudaDecoder(cfg, w, max_len=max_len, max_tokens=128, gemv=gemv)
                generate_cuda(dec, prompt, 8, vocab_size=151665)
                tps = []
                for _ in range(2):
                    st = generate_cuda(dec, prompt, 256, vocab_size=151665).stats
                    tps.append(st["new_tokens"] / (st["time_total"] - st["time_prefill"]))
                dec.limit_vocab(dec.V)
                dec.set_position(256)
                step = time_graph(cp, dec, 1)
                ver = time_graph(cp, dec, 5)
                print(json.dumps(dict(tree=label, shape=name, gemv=gemv, max_len=max_len, engine_tok_s=round(max(tps), 1),
                                      step_ms=round(step, 4), verify5_ms=round(ver, 4), verify5_ratio=round(ver / step, 3))),
                      flush=True)
                del dec
                cp.get_default_memory_pool().free_all_blocks()
        del w
        cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
