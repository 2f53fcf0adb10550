"""Skinny float32 matmul for FastOps: a few activation rows (T <= SKINNY_MAX_ROWS) against one large 2-D
weight. OpenBLAS is 3-5x slower for 2-8 rows against a transposed (out, in) weight than for 1 row, which
made a speculative verify step of gamma+1 tokens cost ~gamma decode steps. These kernels stream each
weight row once for all T rows (memory-bound: time ~ one pass over the weight, flat in T).

Two weight layouts, both without copying the weight:
  * "nk": b is the transposed view of a row-major (N, K) weight (nn.linear's (out, in) weight);
    prange over output columns n, T dot products over a contiguous K row.
  * "kn": b is a row-major (K, N) weight; prange over blocks of n, axpy over contiguous N rows.
Anything else (strided weights, batched b, other dtypes, many rows) stays on np.matmul.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from numba import njit, prange

# rows (after flattening a's batch dims) up to which the skinny kernels beat BLAS; measured in
# project/bench_ops.py --skinny (2-core x86, OpenBLAS): 1 row is about even, 2-16 rows 2-5x faster
SKINNY_MIN_ROWS = 2
SKINNY_MAX_ROWS = 16
# weights smaller than this many elements stay on BLAS (kernel launch / thread wake-up dominates)
SKINNY_MIN_WEIGHT = 1 << 16
_KN_BLOCK = 256
# reassociation lets the K reduction vectorize; no nnan/ninf, so inf/nan propagate like numpy
_FM = {"reassoc", "contract"}


@njit(parallel=True, fastmath=_FM, cache=True)
def _skinny_nk(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - numba
    """out[t, n] = sum_k x[t, k] * w[n, k]; x (T, K) and w (N, K) C-contiguous, out (T, N)."""
    t_len, k_len = x.shape
    for n in prange(w.shape[0]):
        for t in range(t_len):
            acc = np.float32(0.0)
            for k in range(k_len):
                acc += x[t, k] * w[n, k]
            out[t, n] = acc


@njit(parallel=True, fastmath=_FM, cache=True)
def _skinny_kn(x: np.ndarray, w: np.ndarray, out: np.ndarray, block: int) -> None:  # pragma: no cover
    """out[t, n] = sum_k x[t, k] * w[k, n]; x (T, K) and w (K, N) C-contiguous, out (T, N)."""
    t_len, k_len = x.shape
    n_len = w.shape[1]
    n_blocks = (n_len + block - 1) // block
    for nb in prange(n_blocks):
        lo = nb * block
        hi = min(lo + block, n_len)
        acc = np.zeros((t_len, hi - lo), np.float32)
        for k in range(k_len):
            for t in range(t_len):
                xv = x[t, k]
                for j in range(hi - lo):
                    acc[t, j] += xv * w[k, lo + j]
        for t in range(t_len):
            for j in range(hi - lo):
                out[t, lo + j] = acc[t, j]


def skinny_layout(a: np.ndarray, b: np.ndarray) -> Optional[str]:
    """'nk' / 'kn' when a @ b should take a skinny kernel, else None (use BLAS)."""
    if a.dtype != np.float32 or b.dtype != np.float32 or b.ndim != 2 or b.size < SKINNY_MIN_WEIGHT:
        return None
    rows = a.size // a.shape[-1] if a.shape[-1] else 0
    if not SKINNY_MIN_ROWS <= rows <= SKINNY_MAX_ROWS:
        return None
    if b.T.flags.c_contiguous:
        return "nk"
    if b.flags.c_contiguous:
        return "kn"
    return None


def skinny_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray, layout: str) -> None:
    """out = a @ b for a (..., T, K) with a 2-D weight b (K, N) in the given layout; out (..., T, N)."""
    k_len, n_len = b.shape
    x = np.ascontiguousarray(a.reshape(-1, k_len))  # (rows, K); copies only small / strided activations
    direct = out.flags.c_contiguous
    res = out.reshape(-1, n_len) if direct else np.empty((x.shape[0], n_len), np.float32)  # (rows, N)
    if layout == "nk":
        _skinny_nk(x, b.T, res)
    else:
        _skinny_kn(x, b, res, _KN_BLOCK)
    if not direct:
        out[...] = res.reshape(out.shape)
