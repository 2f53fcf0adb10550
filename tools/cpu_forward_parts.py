"""Where a decode step (1 row) and a verify (5 rows) of the target spend their time in the one-call CPU forward
(minitorch/cpu/decoder.py): each kernel it calls is wrapped with a timer, 6 timed rounds after 2 untimed ones at a
220-token context, medians printed in ms; "other" is the rest (numpy adds and copies, the KV cache writes, Python).
Last, the LM head's product alone: its read rate on a weight larger than the caches.

    python tools/cpu_forward_parts.py
"""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

import minitorch
from minitorch.cpu import fused as fast_fused
from minitorch.cpu import packed as fast_packed
from minitorch.models import load_model

PARTS = [(fast_packed, "packed_linear", "products"), (fast_fused, "attention_serial", "attention"),
         (fast_fused, "attention_parallel", "attention"), (fast_fused, "rmsnorm_rows", "rmsnorm"),
         (fast_fused, "rope_rows", "rope"), (fast_fused, "silu_mul_flat", "silu")]


def timed(real: Callable, key: str, acc: dict[str, float]) -> Callable:
    def f(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        r = real(*a, **k)
        acc[key] = acc.get(key, 0.0) + time.perf_counter() - t
        return r
    return f


def main() -> None:
    m, _ = load_model("qwen2.5-coder-1.5b-instruct", progress=False)
    head = m.lm_head_weight()
    real_linear = fast_packed.packed_linear
    acc: dict[str, float] = {}
    for mod, name, key in PARTS:  # decoder.py calls these through its module references, at call time
        setattr(mod, name, timed(getattr(mod, name), key, acc))
    prompt = [int(i) for i in np.random.default_rng(0).integers(100, 20000, 220)]
    res: dict[int, list[dict[str, float]]] = {1: [], 5: []}
    with minitorch.no_grad():
        cache = m.new_cache(600)
        m(prompt, cache)
        for rnd in range(8):
            for rows in (1, 5):
                acc.clear()
                t = time.perf_counter()
                m(prompt[:rows], cache)
                total = time.perf_counter() - t
                cache.truncate(cache.length - rows)
                if rnd >= 2:
                    res[rows].append({"total": total, **acc})
    for rows, rs in res.items():
        med = {k: 1e3 * float(np.median([r.get(k, 0.0) for r in rs])) for k in rs[0]}
        other = med["total"] - sum(v for k, v in med.items() if k != "total")
        print(rows, "rows:", " ".join(f"{k} {v:.1f}" for k, v in med.items()), f"other {other:.1f} ms")

    # the LM head's product alone (its codes are several times the caches, so it streams from memory as in a step)
    x = np.random.default_rng(1).standard_normal((1, head.shape[1])).astype(np.float32)
    out = np.empty((1, head.shape[0]), np.float32)
    times = []
    for i in range(8):
        t = time.perf_counter()
        real_linear(x, head, out)
        if i >= 2:
            times.append(time.perf_counter() - t)
    t = float(np.median(times))
    print(f"LM head alone: {head.nbytes / 1e6:.1f} MB in {t * 1e3:.1f} ms, {head.nbytes / t / 1e9:.2f} GB/s")


if __name__ == "__main__":
    main()
