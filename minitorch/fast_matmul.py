"""Skinny float32 matmul for FastOps: a few activation rows (T <= SKINNY_MAX_ROWS) against one large 2-D
weight. OpenBLAS is 3-5x slower for 2-8 rows against a transposed (out, in) weight than for 1 row, which
made a speculative verify step of gamma+1 tokens cost ~gamma decode steps. The kernel streams each
weight row once for all T rows (memory-bound for small T: time ~ one pass over the weight).

The kernel takes the (out, in) layout nn.linear uses: b is the transposed view of a row-major (N, K) weight
(no copy); for each output column n it computes T dot products over the contiguous K row, so the row is
read from memory once and from L1 T times. Other layouts (row-major (K, N) weights, strided or batched b,
other dtypes, more rows) stay on np.matmul.

The kernel is serial on purpose. On the 2-core machine (numba and OpenBLAS threads competing with other
processes) a parallel version stalled 12-16 ms per call on thread wake-ups, while the serial one streams
the 8960x1536 MLP weight in ~4-6 ms for 1-2 rows (project/bench_ops.py --skinny).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

# rows (after flattening a's batch dims) for which the skinny kernel beats BLAS, measured with
# project/bench_ops.py --skinny on the 2-core x86 box (OpenBLAS): BLAS took 48-240 ms for 2-16 rows of the
# 1.5B's linears where the kernel took 0.3-50 ms
SKINNY_MAX_ROWS = 16
# the 151936x1536 vocab head is memory-bound at 1 row (BLAS 88 ms vs 111 ms) and compute-bound past 8 rows
# (BLAS 360 ms vs 594 ms at 16); above this many weight elements only 2..HUGE_MAX_ROWS rows take the kernel
HUGE_WEIGHT = 1 << 27
HUGE_MAX_ROWS = 8
# one row (a decode step) stays on BLAS: on a quiet machine OpenBLAS's 2 threads read an 8960x1536 weight at
# 44 GB/s against 22 GB/s for this serial kernel (1 thread: 25 vs 27 GB/s), 2026-11-30, /tmp/mm1.py
SKINNY_MIN_ROWS = 2
# reassociation lets the K reduction vectorize; no nnan/ninf, so inf/nan propagate like numpy
_FM = {"reassoc", "contract"}


@njit(fastmath=_FM, cache=True, inline="always")
def _skinny_row(x: np.ndarray, w: np.ndarray, out: np.ndarray, n: int) -> None:  # pragma: no cover - numba
    """out[t, n] = sum_k x[t, k] * w[n, k]; x (T, K) and w (N, K) C-contiguous, out (T, N).
    Rows go 4 (then 2, then 1) at a time so each loaded w[n, k] feeds several accumulators
    (10-35% faster than one row at a time for T >= 2)."""
    t_len, k_len = x.shape
    f0 = np.float32(0.0)
    if True:
        t = 0
        while t + 4 <= t_len:
            a0, a1, a2, a3 = f0, f0, f0, f0
            for k in range(k_len):
                wv = w[n, k]
                a0 += x[t, k] * wv
                a1 += x[t + 1, k] * wv
                a2 += x[t + 2, k] * wv
                a3 += x[t + 3, k] * wv
            out[t, n], out[t + 1, n], out[t + 2, n], out[t + 3, n] = a0, a1, a2, a3
            t += 4
        if t + 2 <= t_len:
            a0, a1 = f0, f0
            for k in range(k_len):
                wv = w[n, k]
                a0 += x[t, k] * wv
                a1 += x[t + 1, k] * wv
            out[t, n], out[t + 1, n] = a0, a1
            t += 2
        if t < t_len:
            a0 = f0
            for k in range(k_len):
                a0 += x[t, k] * w[n, k]
            out[t, n] = a0


@njit(fastmath=_FM, cache=True)
def _skinny_nk(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - numba
    """Serial driver: every output row n of out = x @ w^T."""
    for n in range(w.shape[0]):
        _skinny_row(x, w, out, n)


@njit(fastmath=_FM, cache=True, parallel=True)
def _skinny_nk_par(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - numba
    """Parallel driver: output rows split over numba's threads (each reads its own weight rows)."""
    for n in prange(w.shape[0]):
        _skinny_row(x, w, out, n)


def use_skinny(a: np.ndarray, b: np.ndarray) -> bool:
    """True when a (..., T, K) @ b (K, N) should take the skinny kernel (b a transposed row-major weight)."""
    if a.dtype != np.float32 or b.dtype != np.float32 or b.ndim != 2 or a.shape[-1] == 0 or b.size == 0:
        return False
    if not b.T.flags.c_contiguous:
        return False
    rows = a.size // a.shape[-1]
    if b.size > HUGE_WEIGHT:
        return 2 <= rows <= HUGE_MAX_ROWS
    return SKINNY_MIN_ROWS <= rows <= SKINNY_MAX_ROWS


def skinny_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out = a @ b for a (..., T, K) and b (K, N) whose transpose is C-contiguous; out (..., T, N)."""
    k_len, n_len = b.shape
    x = np.ascontiguousarray(a.reshape(-1, k_len))  # (rows, K); copies only small / strided activations
    direct = out.flags.c_contiguous
    res = out.reshape(-1, n_len) if direct else np.empty((x.shape[0], n_len), np.float32)  # (rows, N)
    _skinny_nk_par(x, b.T, res)  # quiet 2-core box: 2x the serial kernel at 5 rows (/tmp/mm2.py, 2026-11-30)
    if not direct:
        out[...] = res.reshape(out.shape)
