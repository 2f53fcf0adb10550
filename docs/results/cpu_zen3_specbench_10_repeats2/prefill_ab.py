import argparse, time
import numpy as np
from project.settings import add_engine_args, resolve_settings
from project.cli_common import load_models
from minitorch import no_grad
p = argparse.ArgumentParser(); add_engine_args(p)
m = load_models(resolve_settings(p.parse_args(["--drafter", "head"])), progress=False)
tgt = m.target
rng = np.random.default_rng(0)
T = 671
prompt = [int(x) for x in rng.integers(100, 30000, T)]
with no_grad():
    c = tgt.new_cache(T + 8); tgt(prompt[:128], c, last_n=1)
    res = {True: [], False: []}
    for i in range(8):
        h = i % 2 == 0
        c = tgt.new_cache(T + 8); t0 = time.perf_counter()
        out = tgt(prompt, c, last_n=1, return_hidden=h)
        res[h].append(time.perf_counter() - t0)
    for h, v in res.items(): print('return_hidden', h, [round(x, 3) for x in v], 'min %.3f' % min(v))
