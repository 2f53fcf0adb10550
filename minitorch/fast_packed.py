"""numba kernel for FastOps' `packed_linear` slot: out (R, N) = x (R, K) @ w^T with w a PackedWeight.

Layout: output rows n are split over numba's threads in chunks of CHUNK; a thread rebuilds one float32
weight row at a time into a K-long buffer (L1/L2-resident) from its int8 codes and per-block scale and
offset, then takes the dot product of that buffer with each activation row. The weight is read from
memory once per call whatever R is, at 1 + 8/block bytes per element instead of float32's 4.

Every activation row goes through the same dot loop, so row r of a call with R rows is bit for bit the
result of a call with that row alone: a verify pass over gamma+1 tokens reproduces the one-token decode
steps' logits exactly (tests/test_models_packed.py checks it), and greedy speculative decoding equals
greedy decoding of the target by construction, not only up to near-ties.

Prefill-sized inputs (more than MAX_ROWS rows) take a chunked path instead: rebuild CHUNK_BLAS weight rows
into a float32 block and multiply with BLAS, which is compute-efficient for many rows.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

# up to this many activation rows use the row kernel (decode, verify of gamma <= 15); more use BLAS chunks
MAX_ROWS = 16
CHUNK = 64          # weight rows per parallel work item of the row kernel
CHUNK_BLAS = 1024   # weight rows rebuilt per BLAS call on the prefill path
_FM = {"reassoc", "contract"}  # the K reduction vectorizes; no nnan/ninf so inf/nan propagate


@njit(cache=True)
def _rebuild_row(q: np.ndarray, scale: np.ndarray, offset: np.ndarray, n: int, block: int,
                 buf: np.ndarray) -> None:  # pragma: no cover - numba
    """buf = float32 weight row n. No fastmath on purpose: product and difference are rounded
    separately (no fused multiply-add), as the gguf dequantizers do, so buf equals the float32 weights."""
    for b in range(scale.shape[1]):
        a = scale[n, b]
        c = offset[n, b]
        base = b * block
        for j in range(block):
            buf[base + j] = a * np.float32(q[n, base + j]) - c


@njit(fastmath=_FM, cache=True, inline="always")
def _dot(x: np.ndarray, r: int, buf: np.ndarray) -> np.float32:  # pragma: no cover - numba
    acc = np.float32(0.0)
    for k in range(buf.shape[0]):
        acc += x[r, k] * buf[k]
    return acc


@njit(fastmath=_FM, cache=True, parallel=True)
def packed_rows(x: np.ndarray, q: np.ndarray, scale: np.ndarray, offset: np.ndarray, block: int,
                out: np.ndarray) -> None:  # pragma: no cover - numba
    """out (R, N) = x (R, K) @ w^T, each weight row rebuilt once and dotted with every x row."""
    n_len, k_len = q.shape
    rows = x.shape[0]
    n_chunks = (n_len + CHUNK - 1) // CHUNK
    for ch in prange(n_chunks):
        buf = np.empty(k_len, dtype=np.float32)
        for n in range(ch * CHUNK, min(n_len, (ch + 1) * CHUNK)):
            _rebuild_row(q, scale, offset, n, block, buf)
            for r in range(rows):
                out[r, n] = _dot(x, r, buf)


@njit(cache=True, parallel=True)
def rebuild_block(q: np.ndarray, scale: np.ndarray, offset: np.ndarray, block: int, start: int,
                  dst: np.ndarray) -> None:  # pragma: no cover - numba
    """dst[i] = float32 weight row start + i, for i < dst.shape[0]."""
    for i in prange(dst.shape[0]):
        _rebuild_row(q, scale, offset, start + i, block, dst[i])


def packed_linear(x: np.ndarray, w, out: np.ndarray) -> None:
    """FastOps slot: out (R, N) = x (R, K) @ w^T for a PackedWeight w; x and out C-contiguous float32."""
    n_len, k_len = w.shape
    if x.shape[0] <= MAX_ROWS:
        packed_rows(x, w.q, w.scale, w.offset, w.block, out)
        return
    tmp = np.empty((min(CHUNK_BLAS, n_len), k_len), dtype=np.float32)
    for start in range(0, n_len, CHUNK_BLAS):
        m = min(CHUNK_BLAS, n_len - start)
        rebuild_block(w.q, w.scale, w.offset, w.block, start, tmp[:m])
        np.matmul(x, tmp[:m].T, out=out[:, start:start + m])
