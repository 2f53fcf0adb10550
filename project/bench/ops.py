"""FastOps vs plain numpy on the op sizes of a Qwen2-1.5B decode step, plus per-op dispatch cost.

    python project/bench/ops.py [--repeat 10] [--number 0] [--skinny]

--skinny instead times few-row float32 matmuls against (out, in) weights used transposed: np.matmul (BLAS)
vs the skinny numba kernel (minitorch/cpu/matmul.py), for choosing SKINNY_MIN_ROWS / SKINNY_MAX_ROWS.
--stream times the same two over every linear of a Qwen2.5-1.5B-shaped model in a row (197 weights,
6.2 GB of float32: nothing stays in cache, as in a real decode or verify step) and prints GB/s.

Prints one line per op: MiniTorch time, numpy time and their ratio (lower is better, 1.00 = parity).
Both sides run the same math on the same float32 data on this CPU; numpy's matmul is the same BLAS.
"""
from __future__ import annotations

import argparse
import time
from typing import Callable, List, Tuple

import numpy as np

import minitorch
from minitorch import FastBackend, nn


def _loops(fn: Callable[[], object], number: int) -> float:
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number


def bench_pair(f_a: Callable[[], object], f_b: Callable[[], object], repeat: int, number: int) -> Tuple[float, float]:
    """Best-of-`repeat` mean seconds per call of two functions, timed alternately so that load on a
    shared machine hits both alike (number=0 picks a loop count near 0.05 s per side)."""
    f_a(), f_b()
    if number <= 0:
        one = max(_loops(f_a, 1), _loops(f_b, 1), 1e-7)
        number = max(1, min(20000, int(0.05 / one)))
    best_a = best_b = float("inf")
    for _ in range(repeat):
        best_a = min(best_a, _loops(f_a, number))
        best_b = min(best_b, _loops(f_b, number))
    return best_a, best_b


def cases(rng: np.random.Generator) -> List[Tuple[str, Callable[[], object], Callable[[], object]]]:
    B = FastBackend
    f32 = np.float32

    def T(a: np.ndarray) -> minitorch.Tensor:
        return minitorch.from_numpy(a, backend=B)

    out = []
    # matmuls with the checkpoint layout: weight (out, in), used transposed as a view (no copy)
    for n_in, n_out in ((1536, 8960), (8960, 1536)):
        x = rng.standard_normal((1, 1, n_in), dtype=f32)
        w = rng.standard_normal((n_out, n_in), dtype=f32) * 0.02
        tx, tw = T(x), T(w)
        out.append((f"linear 1x{n_in} @ {n_in}x{n_out} (W^T view)",
                    lambda tx=tx, tw=tw: nn.linear(tx, tw), lambda x=x, w=w: x @ w.T))
    x5 = rng.standard_normal((1, 5, 8960), dtype=f32)  # a gamma=4 verify step through the MLP down proj
    w5 = rng.standard_normal((1536, 8960), dtype=f32) * 0.02
    tx5, tw5 = T(x5), T(w5)
    out.append(("linear 5x8960 @ 8960x1536 (W^T view)", lambda: nn.linear(tx5, tw5), lambda: x5 @ w5.T))
    for n in (4096, 151936):
        x = rng.standard_normal((1, n), dtype=f32)
        tx = T(x)

        def np_softmax(x=x):
            e = np.exp(x - x.max(-1, keepdims=True))
            return e / e.sum(-1, keepdims=True)
        out.append((f"softmax over {n}", lambda tx=tx: nn.softmax(tx, -1), np_softmax))
    x = rng.standard_normal((1, 1, 1536), dtype=f32)
    w = rng.standard_normal(1536, dtype=f32)
    tx, tw = T(x), T(w)
    out.append(("rmsnorm 1536", lambda: nn.rmsnorm(tx, tw, 1e-6),
                lambda: x * (1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)) * w))
    g = rng.standard_normal((1, 1, 8960), dtype=f32)
    u = rng.standard_normal((1, 1, 8960), dtype=f32)
    tg, tu = T(g), T(u)
    out.append(("silu_mul 8960", lambda: nn.silu_mul(tg, tu), lambda: g / (1.0 + np.exp(-g)) * u))
    q = rng.standard_normal((1, 12, 1, 128), dtype=f32)
    cos = rng.standard_normal((1, 128), dtype=f32)
    sin = rng.standard_normal((1, 128), dtype=f32)
    tq, tc, ts = T(q), T(cos), T(sin)
    out.append(("rope 12 heads x 128", lambda: nn.rope(tq, tc, ts),
                lambda: q * cos + np.concatenate([-q[..., 64:], q[..., :64]], -1) * sin))
    # decode attention over a 1024-token prefix of a 2048-slot cache (strided view, no copy)
    kc = rng.standard_normal((1, 2, 2048, 128), dtype=f32)
    vc = rng.standard_normal((1, 2, 2048, 128), dtype=f32)
    tk, tv = T(kc).narrow(2, 0, 1024), T(vc).narrow(2, 0, 1024)
    k, v = kc[:, :, :1024], vc[:, :, :1024]

    def np_attn():
        qg = q.reshape(1, 2, 6, 128)                       # (B, Hkv, G*T, D)
        s = (qg @ k.transpose(0, 1, 3, 2)) * (128 ** -0.5)  # (B, Hkv, G*T, L)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        return (p @ v).reshape(1, 12, 1, 128)
    out.append(("attention decode 12q/2kv heads, 1024 ctx, d=128",
                lambda: nn.attention(tq, tk, tv, None, 1023), np_attn))
    # dispatch: tiny tensors, so the time is Python + kernel-call overhead
    a = rng.standard_normal((1, 16), dtype=f32)
    b = rng.standard_normal((1, 16), dtype=f32)
    ta, tb = T(a), T(b)
    out.append(("dispatch: a + b (1x16)", lambda: ta + tb, lambda: a + b))
    out.append(("dispatch: a * 2.0 (1x16)", lambda: ta * 2.0, lambda: a * 2.0))
    out.append(("dispatch: view+permute (1x16)", lambda: ta.view(4, 4).permute(1, 0), lambda: a.reshape(4, 4).T))
    out.append(("dispatch: a.sum(-1) (1x16)", lambda: ta.sum(-1), lambda: a.sum(-1)))
    return out


SKINNY_SHAPES = ((1536, 8960), (8960, 1536), (1536, 1536), (1536, 256), (1536, 151936))  # (in, out)


def skinny_table(rng: np.random.Generator, rows_list: List[int], repeat: int) -> None:
    """BLAS vs the skinny kernel for x (T, in) @ W^T, W (out, in) row-major (the nn.linear layout)."""
    from minitorch.cpu import matmul as fm
    print(f"{'x @ W^T  (T x in @ in x out)':<34} {'T':>3} {'blas':>10} {'skinny':>10} {'blas/skinny':>11}")
    for n_in, n_out in SKINNY_SHAPES:
        w = rng.standard_normal((n_out, n_in), dtype=np.float32) * 0.02
        for t in rows_list:
            x = rng.standard_normal((t, n_in), dtype=np.float32)
            o1 = np.empty((t, n_out), np.float32)
            o2 = np.empty((t, n_out), np.float32)
            t_blas, t_sk = bench_pair(lambda: np.matmul(x, w.T, out=o1),
                                      lambda: fm.skinny_matmul(x, w.T, o2), repeat, 0)
            used = "skinny" if fm.use_skinny(x, w.T) else "blas"
            name = f"{t}x{n_in} @ {n_in}x{n_out}"
            print(f"{name:<34} {t:>3} {t_blas * 1e3:>8.2f}ms {t_sk * 1e3:>8.2f}ms {t_blas / t_sk:>11.2f}"
                  f"  FastOps uses {used}", flush=True)
        del w


def stream_table(rows_list: List[int], repeat: int) -> None:
    """Every linear of a 1.5B-shaped model (28 layers x q,k,v,o,gate,up,down + the 151936-row head), once
    per pass, with 1..16 activation rows: BLAS vs the skinny kernel, streaming from memory."""
    from minitorch.cpu import matmul as fm
    d, kv, f, layers, vocab = 1536, 256, 8960, 28, 151936
    shapes = [(d, d), (kv, d), (kv, d), (d, d), (f, d), (f, d), (d, f)] * layers + [(vocab, d)]
    ws = [np.full(s, 0.01, np.float32) for s in shapes]  # values do not matter for speed (no denormals)
    total = sum(w.nbytes for w in ws)
    print(f"{len(ws)} weights, {total / 1e9:.1f} GB float32; best of {repeat} passes")
    print(f"{'T':>3} {'blas':>10} {'skinny':>10} {'blas GB/s':>10} {'skinny GB/s':>12}")
    for t in rows_list:
        xs = {w.shape[1]: np.full((t, w.shape[1]), 0.5, np.float32) for w in ws}
        outs = [np.empty((t, w.shape[0]), np.float32) for w in ws]
        best = {"blas": float("inf"), "skinny": float("inf")}
        for name in best:  # one implementation at a time: OpenBLAS's idle threads spin for a while after
            for _ in range(repeat):  # a call and would slow numba's threads in alternating passes
                t0 = time.perf_counter()
                for w, o in zip(ws, outs):
                    x = xs[w.shape[1]]
                    if name == "blas":
                        np.matmul(x, w.T, out=o)
                    else:
                        fm.skinny_matmul(x, w.T, o)
                best[name] = min(best[name], time.perf_counter() - t0)
        print(f"{t:>3} {best['blas'] * 1e3:>8.0f}ms {best['skinny'] * 1e3:>8.0f}ms {total / best['blas'] / 1e9:>10.1f} "
              f"{total / best['skinny'] / 1e9:>12.1f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10, help="timing repeats (best is kept)")
    ap.add_argument("--number", type=int, default=0, help="calls per repeat (0: auto, about 0.1 s)")
    ap.add_argument("--seed", type=int, default=0, help="random seed for the inputs")
    ap.add_argument("--skinny", action="store_true", help="time few-row matmuls: BLAS vs the skinny kernel")
    ap.add_argument("--stream", action="store_true",
                    help="time every linear of a 1.5B-shaped model in a row (6.2 GB, from memory): BLAS vs skinny")
    ap.add_argument("--rows", default="1,2,3,5,8,16", help="row counts for --skinny / --stream (comma-separated)")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    if args.stream:
        stream_table([int(r) for r in args.rows.split(",")], args.repeat)
        return
    if args.skinny:
        skinny_table(rng, [int(r) for r in args.rows.split(",")], args.repeat)
        return
    print(f"{'op':<50} {'minitorch':>12} {'numpy':>12} {'ratio':>7}")
    with minitorch.no_grad():
        for name, mt_fn, np_fn in cases(rng):
            t_mt, t_np = bench_pair(mt_fn, np_fn, args.repeat, args.number)
            print(f"{name:<50} {t_mt * 1e6:>10.1f}us {t_np * 1e6:>10.1f}us {t_mt / t_np:>7.2f}")


if __name__ == "__main__":
    main()
