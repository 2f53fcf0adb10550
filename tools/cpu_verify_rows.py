"""A CPU target step's milliseconds by rows (1-4) after 100, 400 and 800 tokens of context (random ids), with the
CLI's settings (int8 activations where the CPU has them): what a verify row costs apart from the engine.

    python tools/cpu_verify_rows.py

Each row count is timed 3 times after a warm-up pass, the cache cut back after each step; the best is printed."""
import argparse
import time

import numpy as np

from project.cli_common import load_models
from project.settings import add_engine_args, resolve_settings


def main() -> None:
    p = argparse.ArgumentParser()
    add_engine_args(p)
    s = resolve_settings(p.parse_args(["--drafter", "model"]))  # the target only: no head, no draft loaded
    target = load_models(s, need_draft=False, progress=False).target
    rng = np.random.default_rng(0)
    for ctx in (100, 400, 800):
        ids = [int(x) for x in rng.integers(100, 30000, ctx)]
        cache = target.new_cache(ctx + 64)
        target(ids, cache)
        base, best = cache.length, {}
        for rep in range(4):  # the first pass warms up
            for rows in (1, 2, 3, 4):
                t0 = time.perf_counter()
                target(ids[:rows], cache)
                dt = time.perf_counter() - t0
                cache.truncate(base)
                if rep:
                    best[rows] = min(best.get(rows, dt), dt)
        print(f"context {ctx}: ms by rows " + "  ".join(f"{r}: {1e3 * t:.1f}" for r, t in best.items()), flush=True)


if __name__ == "__main__":
    main()
