"""A CPU target step's milliseconds by rows (1-4) after contexts of 100, 400 and 800 random tokens, with the CLI's
settings (int8 activations): what a verify row costs apart from the engine. `python tools/cpu_verify_rows.py`"""
import argparse
import time

import numpy as np

from project.settings import add_engine_args, resolve_settings
from project.cli_common import load_models
p = argparse.ArgumentParser(); add_engine_args(p)
s = resolve_settings(p.parse_args(["--drafter", "model"]))
m = load_models(s, need_draft=False, progress=False)
t = m.target
rng = np.random.default_rng(0)
for ctx in (100, 400, 800):
    ids = [int(x) for x in rng.integers(100, 30000, ctx)]
    cache = t.new_cache(ctx + 64)
    t(ids, cache)
    base = cache.length
    res = {}
    for rep in range(4):
        for rows in (1, 2, 3, 4):
            t0 = time.perf_counter()
            t(ids[:rows], cache)
            dt = time.perf_counter() - t0
            cache.truncate(base)
            if rep: res.setdefault(rows, []).append(dt)
    print(ctx, {r: round(1000 * min(v), 1) for r, v in res.items()}, "cache", cache.length, flush=True)
