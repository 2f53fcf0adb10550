"""Skinny float32 matmul for FastOps: 1..SKINNY_MAX_ROWS activation rows against one large 2-D weight,
the shape of every linear in a decode step (1 row) and a speculative verify step (gamma+1 rows).

The kernel takes the (out, in) layout nn.linear uses: b is the transposed view of a row-major (N, K) weight
(no copy). It walks four weight rows side by side, so each thread keeps four memory streams in flight,
and reuses them from L1 for every activation row: the weight is read from memory once per call, at the
speed OpenBLAS's gemv reads it for one row (about 25 GB/s on the 2-core box) and 3-5x faster than
OpenBLAS's gemm for 2-16 rows. Other layouts (row-major (K, N) weights, strided or batched b, other
dtypes, more rows: prefill) stay on np.matmul.

Because 1-row and T-row products go through the same instructions, a verify pass over gamma+1 tokens
yields bit for bit the logits of gamma+1 decode steps (tests/test_core_fast.py, tests/test_models_qwen2.py): greedy
speculative decoding equals greedy decoding by construction, not only away from near-ties.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

# 1..16 rows take the kernel. Over all 197 linears of a 1.5B-shaped model (6.2 GB float32 streamed from
# memory, 2 threads, `python project/bench/ops.py --stream --rows 1,5 --repeat 3`, 2026-11-30 09:03 UTC):
# 1 row 281 ms vs OpenBLAS gemv 269 ms; 5 rows 456 ms vs OpenBLAS gemm 952 ms. The previous kernel (one
# weight row at a time, 1 stream per thread) took 326 ms / 492 ms on the real 1.5B weights (a scratch script, same hour).
SKINNY_MIN_ROWS = 1
SKINNY_MAX_ROWS = 16
# reassociation lets the K reduction vectorize; no nnan/ninf, so inf/nan propagate like numpy
_FM = {"reassoc", "contract"}


GROUP_CHUNK = 8  # groups of 4 output rows per parallel work item


@njit(fastmath=_FM, cache=True, parallel=True)
def _skinny_nk_par(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - numba
    """out (T, N) = x (T, K) @ w^T for w (N, K) C-contiguous.

    Four weight rows are walked side by side (four accumulators per activation row): four concurrent
    memory streams per thread read 24-28 GB/s on the 2-core box where one row at a time read 12 GB/s
    (a scratch streaming-sum test, 2026-11-30: the hardware prefetcher follows each stream). The group's rows stay in
    L1 (4 x K floats) while the other activation rows reuse them. Every out[t, n] is computed by the
    same instruction sequence whatever T is, so a row of a T-row product equals the 1-row product bit
    for bit: a verify pass reproduces the decode steps' logits exactly."""
    n_len, k_len = w.shape
    rows = x.shape[0]
    n_groups = (n_len + 3) // 4
    n_chunks = (n_groups + GROUP_CHUNK - 1) // GROUP_CHUNK
    for ch in prange(n_chunks):
        for g in range(ch * GROUP_CHUNK, min(n_groups, (ch + 1) * GROUP_CHUNK)):
            n0 = 4 * g
            if n0 + 4 <= n_len:
                for t in range(rows):
                    s0, s1, s2, s3 = np.float32(0.0), np.float32(0.0), np.float32(0.0), np.float32(0.0)
                    for k in range(k_len):
                        xv = x[t, k]
                        s0 += xv * w[n0, k]
                        s1 += xv * w[n0 + 1, k]
                        s2 += xv * w[n0 + 2, k]
                        s3 += xv * w[n0 + 3, k]
                    out[t, n0], out[t, n0 + 1], out[t, n0 + 2], out[t, n0 + 3] = s0, s1, s2, s3
            else:  # the last 1-3 rows of a weight whose N is not a multiple of 4
                for n in range(n0, n_len):
                    for t in range(rows):
                        s = np.float32(0.0)
                        for k in range(k_len):
                            s += x[t, k] * w[n, k]
                        out[t, n] = s


def use_skinny(a: np.ndarray, b: np.ndarray) -> bool:
    """True when a (..., T, K) @ b (K, N) should take the skinny kernel (b a transposed row-major weight)."""
    if a.dtype != np.float32 or b.dtype != np.float32 or b.ndim != 2 or a.shape[-1] == 0 or b.size == 0:
        return False
    if not b.T.flags.c_contiguous:
        return False
    rows = a.size // a.shape[-1]
    return SKINNY_MIN_ROWS <= rows <= SKINNY_MAX_ROWS


def skinny_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out = a @ b for a (..., T, K) and b (K, N) whose transpose is C-contiguous; out (..., T, N)."""
    k_len, n_len = b.shape
    x = np.ascontiguousarray(a.reshape(-1, k_len))  # (rows, K); copies only small / strided activations
    direct = out.flags.c_contiguous
    res = out.reshape(-1, n_len) if direct else np.empty((x.shape[0], n_len), np.float32)  # (rows, N)
    _skinny_nk_par(x, b.T, res)
    if not direct:
        out[...] = res.reshape(out.shape)
