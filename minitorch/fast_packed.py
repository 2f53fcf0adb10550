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
    uint32 words of 8 nibbles for bits 4), block scales sc / m under super-block factors d / dmin."""
    groups = qt.shape[0]
    k_len = qt.shape[1] * (8 if bits == 4 else 1)
    rows = x.shape[0]
    has_off = m.shape[1] > 0
    xs = _block_sums(x, block)
    pairs_end = block - block % 2  # an odd block (8-bit codes only) ends with one single input
    for g in prange(groups):
        acc = np.zeros((rows, TILE), dtype=np.float32)
        part = np.empty((rows, TILE), dtype=np.float32)
        scale = np.empty(TILE, dtype=np.float32)
        offset = np.empty(TILE, dtype=np.float32)
        for b in range(k_len // block):
            k0 = b * block
            part[:] = 0
            if bits == 4:  # a uint32 word holds 8 inputs of one row (packed.py); taken in input order
                for j in range(k0 // 8, (k0 + block) // 8):
                    for r in range(rows):
                        x0, x1, x2, x3 = x[r, 8 * j], x[r, 8 * j + 1], x[r, 8 * j + 2], x[r, 8 * j + 3]
                        x4, x5, x6, x7 = x[r, 8 * j + 4], x[r, 8 * j + 5], x[r, 8 * j + 6], x[r, 8 * j + 7]
                        for i in range(TILE):
                            c = np.int32(qt[g, j, i])
                            p = fma(np.float32(c & 15), x0, part[r, i])
                            p = fma(np.float32((c >> 8) & 15), x1, p)
                            p = fma(np.float32((c >> 16) & 15), x2, p)
                            p = fma(np.float32((c >> 24) & 15), x3, p)
                            p = fma(np.float32((c >> 4) & 15), x4, p)
                            p = fma(np.float32((c >> 12) & 15), x5, p)
                            p = fma(np.float32((c >> 20) & 15), x6, p)
                            part[r, i] = fma(np.float32((c >> 28) & 15), x7, p)
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
    k_len = qt.shape[1] * (8 if bits == 4 else 1)
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
                    src = qt[g, k // 8]
                    sh = 8 * (k % 4) + 4 * ((k % 8) // 4)
                    for i in range(TILE):
                        row[i] = a[i] * np.float32((np.int32(src[i]) >> sh) & 15) - c[i]
                else:
                    src8 = qt[g, k]
                    for i in range(TILE):
                        row[i] = a[i] * np.float32(src8[i]) - c[i]


# ----------------------------------------------------------------------------- int8 activations (VNNI)
# A faster mode beside the float one above, for 4-bit weights: each activation row is rounded per block
# of the weight to int8 (xq = round(x / xd), xd = absmax / 127, as llama.cpp's Q8 activations), and a
# block's product is an integer dot product, 64 byte products per AVX512-VNNI instruction (vpdpbusd:
# unsigned nibble codes x signed int8 activations, summed in int32, exact), then
#     acc[r, i] += scale[i] * (xd[r, b] * isum[r, i]) - offset[i] * xs[r, b]     (xs: float sum of x)
# The weights are the same; the activations are rounded, so results differ from the float mode by that
# rounding (project/bench_cpu_packed.py --agreement reports top-1 agreement). Every row is still its own
# computation: row r of an R-row call equals the 1-row call bit for bit, so speculative decoding stays
# identical to target-alone decoding in this mode too. 8-bit codes (Q6_K, Q5_0, Q8_0) keep the float path.

ACTIVATIONS = ("float32", "int8")
_mode = {"activations": "float32"}


def set_activations(mode: str) -> str:
    """Select the activation mode of the packed row kernel ("float32", the default and reference, or
    "int8": VNNI integer products for 4-bit weights); returns the previous mode."""
    if mode not in ACTIVATIONS:
        raise ValueError(f"packed activations must be one of {', '.join(ACTIVATIONS)}, got {mode!r}")
    if mode == "int8" and not has_vnni():
        raise ValueError("int8 activations need a CPU with AVX512-VNNI")
    old, _mode["activations"] = _mode["activations"], mode
    return old


def get_activations() -> str:
    return _mode["activations"]


def has_vnni() -> bool:
    import llvmlite.binding as ll

    return bool(ll.get_host_cpu_features().get("avx512vnni", False))


@intrinsic
def _dp16(typingctx, acc, acc_off, w, w_off, xlo, xhi):  # pragma: no cover - numba
    """acc.flat[acc_off:+16] (int32) += for each of 16 lanes: the 4 low nibbles of w.flat[w_off + lane]
    (uint32) times the 4 int8 bytes of xlo, plus its 4 high nibbles times those of xhi (two vpdpbusd)."""
    sig = types.void(acc, types.intp, w, types.intp, types.int32, types.int32)

    def codegen(context, builder, signature, args):
        acc_a = context.make_array(signature.args[0])(context, builder, args[0])
        w_a = context.make_array(signature.args[2])(context, builder, args[2])
        i32 = ir.IntType(32)
        v16 = ir.VectorType(i32, 16)
        pacc = builder.bitcast(builder.gep(acc_a.data, [args[1]]), v16.as_pointer())
        pw = builder.bitcast(builder.gep(w_a.data, [args[3]]), v16.as_pointer())
        a = builder.load(pacc, align=4)
        wv = builder.load(pw, align=4)
        mask = ir.Constant(v16, [ir.Constant(i32, 0x0F0F0F0F)] * 16)
        lo = builder.and_(wv, mask)
        hi = builder.and_(builder.lshr(wv, ir.Constant(v16, [ir.Constant(i32, 4)] * 16)), mask)
        zeros = ir.Constant(v16, [ir.Constant(i32, 0)] * 16)

        def splat(v):
            u = builder.insert_element(ir.Constant(v16, ir.Undefined), v, ir.Constant(i32, 0))
            return builder.shuffle_vector(u, ir.Constant(v16, ir.Undefined), zeros)

        fn = builder.module.declare_intrinsic("llvm.x86.avx512.vpdpbusd.512", [], ir.FunctionType(v16, [v16, v16, v16]))
        a = builder.call(fn, [a, lo, splat(args[4])])
        a = builder.call(fn, [a, hi, splat(args[5])])
        builder.store(a, pacc, align=4)
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True)
def quantize_rows(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover
    """(xq int8 (R, K), xd float32 (R, K / block), xs float32 (R, K / block)): per block of each row,
    xd = absmax / 127, xq = round-half-even(x / xd), xs = the float sum of x (for the weights' offsets)."""
    rows, k_len = x.shape
    nb = k_len // block
    xq = np.empty((rows, k_len), dtype=np.int8)
    xd = np.empty((rows, nb), dtype=np.float32)
    xs = np.empty((rows, nb), dtype=np.float32)
    for r in range(rows):
        for b in range(nb):
            amax = np.float32(0.0)
            s = np.float32(0.0)
            for k in range(b * block, (b + 1) * block):
                amax = max(amax, abs(x[r, k]))
                s += x[r, k]
            xs[r, b] = s
            dd = amax / np.float32(127.0)
            xd[r, b] = dd
            inv = np.float32(1.0) / dd if dd > 0 else np.float32(0.0)
            for k in range(b * block, (b + 1) * block):
                xq[r, k] = np.int8(np.rint(x[r, k] * inv))
    return xq, xd, xs


@njit(cache=True, parallel=True)
def packed_rows_q8(xq32: np.ndarray, xd: np.ndarray, xs: np.ndarray, qt: np.ndarray, sc: np.ndarray, d: np.ndarray,
                   m: np.ndarray, dmin: np.ndarray, block: int, per: int, n_len: int,
                   out: np.ndarray) -> None:  # pragma: no cover - numba
    """out (R, n_len) = the int8-activation product for 4-bit tiles qt (G, K / 8, TILE) uint32; xq32 is
    the (R, K / 4) int32 view of quantize_rows' xq."""
    groups, nw, _ = qt.shape
    k_len = nw * 8
    rows = xq32.shape[0]
    has_off = m.shape[1] > 0
    for g in prange(groups):
        acc = np.zeros((rows, TILE), dtype=np.float32)
        isum = np.empty((rows, TILE), dtype=np.int32)
        scale = np.empty(TILE, dtype=np.float32)
        offset = np.zeros(TILE, dtype=np.float32)
        for b in range(k_len // block):
            isum[:] = 0
            for j in range(b * block // 8, (b + 1) * block // 8):
                for r in range(rows):
                    xlo = xq32[r, 2 * j]
                    xhi = xq32[r, 2 * j + 1]
                    for i0 in range(0, TILE, 16):
                        _dp16(isum, r * TILE + i0, qt, (g * nw + j) * TILE + i0, xlo, xhi)
            s = b // per
            for i in range(TILE):
                scale[i] = d[g, s, i] * np.float32(sc[g, b, i])
            if has_off:
                for i in range(TILE):
                    offset[i] = dmin[g, s, i] * np.float32(m[g, b, i])
            for r in range(rows):
                xdb = xd[r, b]
                xsb = xs[r, b]
                for i in range(TILE):
                    acc[r, i] += scale[i] * (xdb * np.float32(isum[r, i])) - offset[i] * xsb
        mm = min(TILE, n_len - g * TILE)
        for r in range(rows):
            for i in range(mm):
                out[r, g * TILE + i] = acc[r, i]


def packed_linear_q8(x: np.ndarray, w, out: np.ndarray) -> None:
    """The int8-activation product of a 4-bit PackedWeight (at most MAX_ROWS rows)."""
    xq, xd, xs = quantize_rows(x, w.block)
    packed_rows_q8(xq.view(np.int32), xd, xs, *w.tiles, w.block, w.per, w.shape[0], out)


def packed_linear(x: np.ndarray, w, out: np.ndarray) -> None:
    """FastOps slot: out (R, N) = x (R, K) @ w^T for a PackedWeight w; x and out C-contiguous float32."""
    n_len, k_len = w.shape
    if x.shape[0] <= MAX_ROWS and w.bits == 4 and _mode["activations"] == "int8":
        packed_linear_q8(x, w, out)
        return
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
