"""Where a decode step (1 row) and a verify (5 rows) of the target spend their time in the one-call CPU forward
(minitorch/cpu/decoder.py): each kernel it calls is wrapped with a timer, 6 timed rounds after 2 untimed ones at a
220-token context, medians printed in ms; "other" is the rest (numpy adds and copies, the KV cache writes, Python).

    python tools/cpu_forward_parts.py
"""
import time
import numpy as np
import minitorch
from minitorch.models import load_model
from minitorch.cpu import decoder as dec, fused as ff

m, tok = load_model("qwen2.5-coder-1.5b-instruct", progress=False)
acc = {}
def wrap(mod, name, key):
    real = getattr(mod, name)
    def f(*a, **k):
        t = time.perf_counter(); r = real(*a, **k); acc[key] = acc.get(key, 0.0) + time.perf_counter() - t; return r
    setattr(mod, name, f)
wrap(dec.fp, "packed_linear", "products")
wrap(dec.ff, "attention_serial", "attention")
wrap(dec.ff, "attention_parallel", "attention")
wrap(dec.ff, "rmsnorm_rows", "rmsnorm")
wrap(dec.ff, "rope_rows", "rope")
wrap(dec.ff, "silu_mul_flat", "silu")
prompt = [int(i) for i in np.random.default_rng(0).integers(100, 20000, 220)]
res = {1: [], 5: []}
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
    keys = rs[0].keys()
    med = {k: 1e3 * float(np.median([r.get(k, 0.0) for r in rs])) for k in keys}
    other = med["total"] - sum(v for k, v in med.items() if k != "total")
    print(rows, "rows:", " ".join(f"{k} {v:.1f}" for k, v in med.items()), f"other {other:.1f} ms")
