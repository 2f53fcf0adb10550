"""numba kernel for FastOps' `packed_linear` slot: out (R, N) = x (R, K) @ w^T with w a PackedWeight.

Layout (minitorch/packed.py): TILE weight rows are interleaved, so for each input k the TILE codes of
a tile are adjacent. A thread owns whole tiles; for each block b of `block` inputs it sums, per output
lane i and activation row r, one fused multiply-add per input, in input order:

    part[r, i] = fma(q[i, k], x[r, k], part[r, i])       for k = first .. last input of b

(fma(a, b, c) = a * b + c rounded once; the loop over the TILE lanes is what vectorizes: one int8 ->
float32 convert and one vfmadd per 8 lanes, no horizontal sums), then folds the block's scale and
offset in once:

    acc[r, i] += scale[i, b] * part[r, i] - offset[i, b] * sum_k x[r, k]     (same as sum of w[i, k] x[r, k])

The weight is read from memory once per call whatever R is, at 1 + 8/block bytes per element instead of
float32's 4. The loop takes inputs two at a time (part is loaded and stored once per pair) and LLVM
converts each pair's codes once for all R rows (asm checked; an explicit convert-once buffer measured
slower); neither changes the chain above. The fma is explicit (llvm.fma.f32, exactly one rounding:
the FMA instruction here, libm's fmaf on a CPU without one), not left to fastmath: no fastmath flag is
set, so nothing is reassociated and the fold keeps its two roundings (scale * code - offset, as gguf
dequantizes). So the result is a fixed function of the inputs; every activation row runs the same
chain, so row r of a call with R rows is bit for bit the result of a call with that row alone: a
verify pass over gamma+1 tokens reproduces the one-token decode steps' logits exactly, and one-hot
activations read out the float32 weights bit for bit (tests/test_models_packed.py checks both). Greedy
speculative decoding equals greedy decoding of the target by construction, not only up to near-ties.
Against the separate multiply and add it replaced, the fma halves the floating-point work of the row
loop: over one forward's products of the 1.5B target (2-core box, old and new kernel alternating per
forward, two runs of 9 and 12 rounds, paired medians) 5 rows took 12-16% less time (294 -> 253 ms),
8 rows 6-11%, 1 row 0-3% (one row is bound by reading the weights, not by arithmetic).

Prefill-sized inputs (more than MAX_ROWS rows) take a chunked path instead: rebuild CHUNK_TILES tiles as
one contiguous float32 (K, CHUNK_TILES * TILE) block (the transposed weight rows) and multiply with BLAS,
which is compute-efficient for many rows.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from .packed import TILE

# up to this many activation rows use the row kernel (decode, verify of gamma <= 15); more use BLAS chunks
MAX_ROWS = 16
CHUNK_TILES = 4  # tiles (of TILE weight rows) rebuilt per BLAS call on the prefill path (L2-sized)
_FM = {"reassoc", "contract"}  # only for the per-block sums of x (a few hundred additions per call)


@intrinsic
def fma(typingctx, a, b, c):  # pragma: no cover - numba
    """fma(a, b, c) = a * b + c for float32, rounded once (LLVM's llvm.fma.f32)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f32], ir.FunctionType(f32, [f32, f32, f32]))
        return builder.call(fn, args)

    return sig, codegen


@njit(fastmath=_FM, cache=True)
def _block_sums(x: np.ndarray, block: int) -> np.ndarray:  # pragma: no cover - numba
    """xs[r, b] = sum of x[r, k] over block b."""
    rows, k_len = x.shape
    xs = np.empty((rows, k_len // block), dtype=np.float32)
    for r in range(rows):
        for b in range(k_len // block):
            s = np.float32(0.0)
            for k in range(b * block, (b + 1) * block):
                s += x[r, k]
            xs[r, b] = s
    return xs


@njit(cache=True, parallel=True)
def packed_rows(x: np.ndarray, qt: np.ndarray, sc: np.ndarray, d: np.ndarray, m: np.ndarray, dmin: np.ndarray,
                block: int, per: int, bits: int, n_len: int, out: np.ndarray) -> None:  # pragma: no cover - numba
    """out (R, n_len) = x (R, K) @ w^T for the tiles of a PackedWeight (packed.py): codes qt (int8, or
    uint8 nibble pairs for bits 4), block scales sc / m under super-block factors d / dmin."""
    groups = qt.shape[0]
    k_len = qt.shape[1] * 8 // bits
    rows = x.shape[0]
    has_off = m.shape[1] > 0
    xs = _block_sums(x, block)
    pairs_end = block - block % 2  # an odd block (8-bit codes only) ends with one single input
    lo_mask = np.uint8(15)
    for g in prange(groups):
        acc = np.zeros((rows, TILE), dtype=np.float32)
        part = np.empty((rows, TILE), dtype=np.float32)
        scale = np.empty(TILE, dtype=np.float32)
        offset = np.empty(TILE, dtype=np.float32)
        for b in range(k_len // block):
            k0 = b * block
            part[:] = 0
            if bits == 4:
                for j in range(k0 // 2, (k0 + block) // 2):
                    for r in range(rows):
                        x0 = x[r, 2 * j]
                        x1 = x[r, 2 * j + 1]
                        for i in range(TILE):
                            c = qt[g, j, i]
                            p = fma(np.float32(c & lo_mask), x0, part[r, i])
                            part[r, i] = fma(np.float32(c >> 4), x1, p)
            else:
                for k in range(k0, k0 + pairs_end, 2):
                    for r in range(rows):
                        x0 = x[r, k]
                        x1 = x[r, k + 1]
                        for i in range(TILE):
                            p = fma(np.float32(qt[g, k, i]), x0, part[r, i])
                            part[r, i] = fma(np.float32(qt[g, k + 1, i]), x1, p)
                if pairs_end < block:
                    k = k0 + block - 1
                    for r in range(rows):
                        x0 = x[r, k]
                        for i in range(TILE):
                            part[r, i] = fma(np.float32(qt[g, k, i]), x0, part[r, i])
            s = b // per
            for i in range(TILE):
                scale[i] = d[g, s, i] * np.float32(sc[g, b, i])
            if has_off:
                for i in range(TILE):
                    offset[i] = dmin[g, s, i] * np.float32(m[g, b, i])
                for r in range(rows):
                    xb = xs[r, b]
                    for i in range(TILE):
                        acc[r, i] += scale[i] * part[r, i] - offset[i] * xb
            else:
                for r in range(rows):
                    for i in range(TILE):
                        acc[r, i] += scale[i] * part[r, i]
        mm = min(TILE, n_len - g * TILE)
        for r in range(rows):
            for i in range(mm):
                out[r, g * TILE + i] = acc[r, i]


@njit(cache=True)
def rebuild_tiles(qt: np.ndarray, sc: np.ndarray, d: np.ndarray, m: np.ndarray, dmin: np.ndarray, block: int,
                  per: int, bits: int, first: int, dst: np.ndarray) -> None:  # pragma: no cover - numba
    """dst (K, m * TILE) = float32 weight rows of tiles first..first+m-1, transposed (column j * TILE + i
    is row (first + j) * TILE + i). Each product and the difference are rounded separately, as the gguf
    dequantizers do: the float32 weights. One thread on purpose: OpenBLAS's worker threads keep spinning
    for a while after each product, and a numba-parallel rebuild between products had to share the 2
    cores with them (a 40-row product of a 8960 x 1536 weight: 68 ms parallel vs 22 ms serial in a
    scratch test; with OPENBLAS_THREAD_TIMEOUT=4 the gap closed, but that is read when numpy loads)."""
    k_len = qt.shape[1] * 8 // bits
    has_off = m.shape[1] > 0
    a = np.empty(TILE, dtype=np.float32)
    c = np.zeros(TILE, dtype=np.float32)
    for j in range(dst.shape[1] // TILE):
        g = first + j
        for b in range(k_len // block):
            s = b // per
            for i in range(TILE):
                a[i] = d[g, s, i] * np.float32(sc[g, b, i])
                if has_off:
                    c[i] = dmin[g, s, i] * np.float32(m[g, b, i])
            for k in range(b * block, (b + 1) * block):
                row = dst[k, j * TILE:(j + 1) * TILE]
                if bits == 4:
                    src = qt[g, k // 2]
                    sh = np.uint8(4 * (k % 2))
                    for i in range(TILE):
                        row[i] = a[i] * np.float32((src[i] >> sh) & np.uint8(15)) - c[i]
                else:
                    src8 = qt[g, k]
                    for i in range(TILE):
                        row[i] = a[i] * np.float32(src8[i]) - c[i]


def packed_linear(x: np.ndarray, w, out: np.ndarray) -> None:
    """FastOps slot: out (R, N) = x (R, K) @ w^T for a PackedWeight w; x and out C-contiguous float32."""
    n_len, k_len = w.shape
    if x.shape[0] <= MAX_ROWS:
        packed_rows(x, *w.tiles, w.block, w.per, w.bits, n_len, out)
        return
    groups = w.qt.shape[0]
    tmp = np.empty((k_len, min(CHUNK_TILES, groups) * TILE), dtype=np.float32)
    for first in range(0, groups, CHUNK_TILES):
        m = min(CHUNK_TILES, groups - first)
        rebuild_tiles(*w.tiles, w.block, w.per, w.bits, first, tmp[:, :m * TILE])
        col = first * TILE
        cols = min(n_len, col + m * TILE) - col
        # into a contiguous result first: numpy's matmul skips BLAS for a strided `out`
        out[:, col:col + cols] = np.matmul(x, tmp[:, :m * TILE])[:, :cols]  # padding rows dropped
