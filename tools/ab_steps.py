"""A/B timer of the CUDA decoder's steps: the one-token decode step, the 8-row verify step (gamma 3 + 4 looked up)
and target-alone engine tokens/s of random-weight Qwen2.5-Coder shapes at the CLI's 32k-position cache, with the
CLI's settings (target: gemv "tc" and "ours"; draft: "ourstc" with 8-bit rows). It uses only APIs that the trees
before and after issue 25 share, so one file times two trees in the same call:

    PYTHONPATH=<tree> python3 tools/ab_steps.py LABEL        (one JSON line per shape and setting)

tools/gpu.sh ab-steps runs it over $BASE (a copy of an older commit) and this checkout."""
import json
import sys
from types import SimpleNamespace

import numpy as np

SETTINGS = {"coder-1.5b": [dict(gemv="tc"), dict(gemv="ours")],
            "coder-0.5b": [dict(gemv="ourstc", int8_weights=True)]}


def main() -> int:
    from minitorch.cuda.runtime import cupy_or_exit

    cp = cupy_or_exit("tools/ab_steps.py")
    from minitorch.cuda.decoder import CudaDecoder, random_weights
    from minitorch.generation.cuda import generate_cuda

    from project.bench import throughput  # this checkout's bench: its shapes and its graph timer

    label = sys.argv[1] if len(sys.argv) > 1 else "tree"
    shapes = {"coder-1.5b": throughput.SHAPES["qwen2.5-coder-1.5b"], "coder-0.5b": throughput.SHAPES["qwen2.5-coder-0.5b"]}
    prompt = [int(x) for x in np.random.default_rng(0).integers(0, 151665, 128)]
    for name, kw in shapes.items():
        cfg = SimpleNamespace(**kw)
        w = random_weights(cfg, seed=0)
        for setting in SETTINGS[name]:
            dec = CudaDecoder(cfg, w, max_len=32768, max_tokens=128, **setting)
            generate_cuda(dec, prompt, 8, vocab_size=151665)
            tps = []
            for _ in range(2):
                st = generate_cuda(dec, prompt, 256, vocab_size=151665).stats
                tps.append(st["new_tokens"] / (st["time_total"] - st["time_prefill"]))
            dec.limit_vocab(dec.V)
            dec.set_position(256)
            step = 1e3 * throughput.time_graph(cp, dec, 1, 30)
            ver = 1e3 * throughput.time_graph(cp, dec, 8, 30)
            print(json.dumps(dict(tree=label, shape=name, **setting, engine_tok_s=round(max(tps), 1),
                                  step_ms=round(step, 4), verify8_ms=round(ver, 4), verify8_ratio=round(ver / step, 3))),
                  flush=True)
            del dec
            cp.get_default_memory_pool().free_all_blocks()
        del w
        cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
