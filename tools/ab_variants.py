"""Device helper (issue 14): decode / 5-token verify step of the Qwen2.5-Coder shapes (random weights,
gemv="ours") at a 32k-position cache for attention split sizes and slot counts, against a 400-position
cache. One JSON line per variant.   PYTHONPATH=. python3 tools/ab_variants.py"""
import json
import os
import sys
from types import SimpleNamespace

import minitorch.cuda.decoder as cd
from ab_long_cache import SHAPES, time_graph

VARIANTS = [("short", 1200, None, 264, 32), ("kb64", 32768, 64, 264, 32), ("kb32", 32768, 32, 264, 32),
            ("kb32-s64", 32768, 32, 64, 16), ("kb32-s32", 32768, 32, 32, 8), ("kb128", 32768, 128, 264, 32)]


def main():
    from minitorch.cuda.runtime import cupy_or_exit

    cp = cupy_or_exit("tools/ab_variants.py")

    only = set(sys.argv[1:])  # variant labels to run (default all)
    for name, kw in SHAPES.items():
        cfg = SimpleNamespace(**kw)
        w = cd.random_weights(cfg, seed=0)
        for label, max_len, kb, blocks, mins in VARIANTS:
            if only and label not in only:
                continue
            cd.ATT_SLOT_BLOCKS, cd.ATT_MIN_SLOTS = blocks, mins
            dec = cd.CudaDecoder(cfg, w, max_len=max_len, max_tokens=128, gemv="ours", attn_kb=kb)
            dec.prefill(list(range(100, 228)))
            res = {}
            for pos in (256, 1024):
                dec.set_position(pos)
                res[pos] = (time_graph(cp, dec, 1), time_graph(cp, dec, 5))
            print(json.dumps(dict(shape=name, variant=label, build=os.environ.get("MINITORCH_CUDA_BUILD_DIR", "default"),
                                  kb=dec.kb, **{
                f"step_ms@{p}": round(a, 4) for p, (a, _) in res.items()}, **{
                f"verify5_ms@{p}": round(b, 4) for p, (_, b) in res.items()})), flush=True)
            del dec
            cp.get_default_memory_pool().free_all_blocks()
        del w
        cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    sys.exit(main())
