"""Where a decode step (1 row) and a verify (5 rows) of the target spend their time in the one-call CPU forward
(minitorch/cpu/decoder.py): each kernel it calls is wrapped with a timer, 6 timed rounds after 2 untimed ones at a
220-token context, medians printed in ms; "other" is the rest (numpy adds and copies, the KV cache writes, Python).
Last, the LM head's product alone: its read rate on a weight larger than the caches.

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

# The LM head's product alone (its 8-bit codes are several times the caches, so it streams from memory as in a
# step): the kernel's achieved read rate on one large weight, against the box's read bound
from minitorch.cpu import packed as fast_packed  # noqa: E402

head = m.lm_head_weight()
x = np.random.default_rng(1).standard_normal((1, head.shape[1])).astype(np.float32)
out = np.empty((1, head.shape[0]), np.float32)
times = []
for i in range(8):
    t = time.perf_counter()
    fast_packed.packed_linear(x, head, out)
    if i >= 2:
        times.append(time.perf_counter() - t)
t = float(np.median(times))
print(f"LM head alone: {head.nbytes / 1e6:.1f} MB in {t * 1e3:.1f} ms, {head.nbytes / t / 1e9:.2f} GB/s")
