import argparse, time
import numpy as np
from project.settings import add_engine_args, resolve_settings
from project.cli_common import load_models
from minitorch import no_grad, from_numpy
from minitorch.generation.head_drafter import HeadDrafter
p = argparse.ArgumentParser(); add_engine_args(p)
m = load_models(resolve_settings(p.parse_args(["--drafter", "head"])), progress=False)
tgt, head = m.target, m.head
rng = np.random.default_rng(0)
with no_grad():
    for T in (40, 40, 80, 160, 640):
        prompt = [int(x) for x in rng.integers(100, 30000, T)]
        c = tgt.new_cache(T + 8); t0 = time.perf_counter(); lg, feats = tgt(prompt, c, last_n=1, return_hidden=True); a = time.perf_counter() - t0
        d = HeadDrafter(head, tgt); d.start(prompt, T + 8, m.vocab_size)
        arr = np.asarray(feats.to_numpy(), dtype=np.float32).reshape(-1, head.config.hidden_size)
        ts = {}
        for _ in range(5):
            for name in ("embed", "kv"):
                d.cache = head.new_cache(T + 8)
                t0 = time.perf_counter()
                F = from_numpy(arr[:T - 1][None], backend=head.backend)
                e = d._embed(prompt[1:T])
                if name == "kv":
                    head.draft_step(F, e, d.cache, d._lm, d._rows(), kv_only=True)
                ts.setdefault(name, []).append(time.perf_counter() - t0)
        print(f"T={T} prefill {a*1e3:.0f} ms; embed+convert {min(ts['embed'])*1e3:.2f} ms; kv-only pass (incl.) {min(ts['kv'])*1e3:.2f} ms ({min(ts['kv'])/a:.2%})", flush=True)
