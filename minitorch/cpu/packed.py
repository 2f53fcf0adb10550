"""numba kernel for FastOps' `packed_linear` slot: out (R, N) = x (R, K) @ w^T with w a PackedWeight.

Layout (minitorch/packed.py): TILE weight rows are interleaved, so for each input k the TILE codes of
a tile are adjacent. A thread owns whole tiles; for each block b of `block` inputs it sums, per output
lane i and activation row r, one fused multiply-add per input, in input order:

    part[r, i] = fma(q[i, k], x[r, k], part[r, i])       for k = first .. last input of b

(fma(a, b, c) = a * b + c rounded once; the loop over the TILE lanes is what vectorizes: one code ->
float32 convert and one vfmadd per 16 lanes, no horizontal sums; 4-bit codes come 8 inputs to a uint32
word, unpacked by shift and mask, and taken in the same input order), then folds the block's scale
(d * sc) and offset (dmin * m) in once:

    acc[r, i] += scale[i, b] * part[r, i] - offset[i, b] * sum_k x[r, k]     (same as sum of w[i, k] x[r, k])

The chain is the same whether the codes are nibbles or int8 and whatever the scales are stored as, so
the nibble form gives the previous int8 form's bits (tests/test_models_packed.py). It is compute-bound:
one convert and one fma per weight and row; the int8-activation mode below replaces them by integer
dot products.

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
from numba.core import cgutils
from numba.extending import intrinsic

from ..packed import TILE

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


def _vec_ptr(context, builder, aryty, ary, off, vty):
    """Pointer to the vector type vty at element `off` of a C-contiguous array."""
    a = context.make_array(aryty)(context, builder, ary)
    return builder.bitcast(builder.gep(a.data, [off]), vty.as_pointer())


def _splat(builder, v, vty):
    i32 = ir.IntType(32)
    u = builder.insert_element(ir.Constant(vty, ir.Undefined), v, ir.Constant(i32, 0))
    return builder.shuffle_vector(u, ir.Constant(vty, ir.Undefined), ir.Constant(ir.VectorType(i32, vty.count), [ir.Constant(i32, 0)] * vty.count))


@intrinsic
def _fma_words(typingctx, part, part_off, rows, w, w_off, stride, nwords, x, x_off, x_stride):  # pragma: no cover
    """For 16 lanes and each row r < rows: part.flat[part_off + r * 128 : +16] (float32) continues its fma
    chain over nwords uint32 code words w.flat[w_off + t * stride + lane] (8 nibbles each, inputs 8t..8t+7
    in order: low nibbles of bytes 0..3, then their high nibbles) times x.flat[x_off + r * x_stride + 8t +
    0..7]: one fma per input, rounded once. A word is unpacked once for all rows."""
    sig = types.void(part, types.intp, types.intp, w, types.intp, types.intp, types.intp, x, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        part_v, part_off_v, rows_v, w_v, w_off_v, stride_v, nwords_v, x_v, x_off_v, x_stride_v = args
        f32, i32 = ir.FloatType(), ir.IntType(32)
        vf, vi = ir.VectorType(f32, 16), ir.VectorType(i32, 16)
        pa = context.make_array(signature.args[0])(context, builder, part_v)
        xa = context.make_array(signature.args[7])(context, builder, x_v)
        wa = context.make_array(signature.args[3])(context, builder, w_v)
        fma_v = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vf, vf]), "llvm.fma.v16f32")
        mask = ir.Constant(vi, [ir.Constant(i32, 15)] * 16)
        ity = part_off_v.type
        with cgutils.for_range(builder, nwords_v) as wl:
            t = wl.index
            wp = builder.bitcast(builder.gep(wa.data, [builder.add(w_off_v, builder.mul(t, stride_v))]), vi.as_pointer())
            wv = builder.load(wp, align=4)
            codes = [builder.sitofp(builder.and_(builder.lshr(wv, ir.Constant(vi, [ir.Constant(i32, sh)] * 16)), mask), vf)
                     for sh in (0, 8, 16, 24, 4, 12, 20, 28)]
            with cgutils.for_range(builder, rows_v) as rl:
                r = rl.index
                pp = builder.bitcast(builder.gep(pa.data, [builder.add(part_off_v, builder.mul(r, ir.Constant(ity, 128)))]),
                                     vf.as_pointer())
                acc = builder.load(pp, align=4)
                base = builder.add(builder.add(x_off_v, builder.mul(r, x_stride_v)), builder.mul(t, ir.Constant(ity, 8)))
                for n, c in enumerate(codes):
                    xv = builder.load(builder.gep(xa.data, [builder.add(base, ir.Constant(ity, n))]))
                    acc = builder.call(fma_v, [c, _splat(builder, xv, vf), acc])
                builder.store(acc, pp, align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _dot_words(typingctx, isum, isum_off, rows, w, w_off, stride, nwords, xq, x_off, x_stride):  # pragma: no cover
    """For 16 lanes and each row r < rows: isum.flat[isum_off + r * 128 : +16] (int32) += sum over nwords
    uint32 code words w.flat[w_off + t * stride + lane] of their 4 low nibbles times the int8 bytes of
    xq.flat[x_off + r * x_stride + 2t] (an int32 view) and their 4 high nibbles times those of the next
    word: AVX512-VNNI vpdpbusd (unsigned x signed bytes, summed in int32), exact."""
    sig = types.void(isum, types.intp, types.intp, w, types.intp, types.intp, types.intp, xq, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        isum_v, isum_off_v, rows_v, w_v, w_off_v, stride_v, nwords_v, x_v, x_off_v, x_stride_v = args
        i32 = ir.IntType(32)
        vi = ir.VectorType(i32, 16)
        ia = context.make_array(signature.args[0])(context, builder, isum_v)
        xa = context.make_array(signature.args[7])(context, builder, x_v)
        wa = context.make_array(signature.args[3])(context, builder, w_v)
        dp = builder.module.declare_intrinsic("llvm.x86.avx512.vpdpbusd.512", [], ir.FunctionType(vi, [vi, vi, vi]))
        mask = ir.Constant(vi, [ir.Constant(i32, 0x0F0F0F0F)] * 16)
        four = ir.Constant(vi, [ir.Constant(i32, 4)] * 16)
        ity = isum_off_v.type
        with cgutils.for_range(builder, nwords_v) as wl:
            t = wl.index
            wp = builder.bitcast(builder.gep(wa.data, [builder.add(w_off_v, builder.mul(t, stride_v))]), vi.as_pointer())
            wv = builder.load(wp, align=4)
            lo = builder.and_(wv, mask)
            hi = builder.and_(builder.lshr(wv, four), mask)
            with cgutils.for_range(builder, rows_v) as rl:
                r = rl.index
                pp = builder.bitcast(builder.gep(ia.data, [builder.add(isum_off_v, builder.mul(r, ir.Constant(ity, 128)))]),
                                     vi.as_pointer())
                xo = builder.add(builder.add(x_off_v, builder.mul(r, x_stride_v)), builder.mul(t, ir.Constant(ity, 2)))
                xlo = builder.load(builder.gep(xa.data, [xo]))
                xhi = builder.load(builder.gep(xa.data, [builder.add(xo, ir.Constant(ity, 1))]))
                acc = builder.load(pp, align=4)
                acc = builder.call(dp, [acc, lo, _splat(builder, xlo, vi)])
                acc = builder.call(dp, [acc, hi, _splat(builder, xhi, vi)])
                builder.store(acc, pp, align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _dot_bytes(typingctx, isum, isum_off, rows, w, w_off, nquads, xq, x_off, x_stride):  # pragma: no cover
    """For 16 lanes and each row r < rows: isum.flat[isum_off + r * 128 : +16] (int32) += sum over nquads
    groups of 4 inputs of (code + 128) * xq, the codes int8 at w.flat[w_off + (4t + u) * 128 + lane]
    (u = 0..3: the tiled layout, 128 lanes per input), xq the int8 bytes of xq.flat[x_off + r * x_stride +
    t] (an int32 view). The 4 codes of a lane are gathered into one dword (a byte shuffle), flipped to
    unsigned by adding 128, and multiplied by vpdpbusd; the caller takes 128 * sum(xq) off, exact."""
    sig = types.void(isum, types.intp, types.intp, w, types.intp, types.intp, xq, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        isum_v, isum_off_v, rows_v, w_v, w_off_v, nquads_v, x_v, x_off_v, x_stride_v = args
        i8, i32 = ir.IntType(8), ir.IntType(32)
        vi = ir.VectorType(i32, 16)
        v16b, v32b, v64b = ir.VectorType(i8, 16), ir.VectorType(i8, 32), ir.VectorType(i8, 64)
        ia = context.make_array(signature.args[0])(context, builder, isum_v)
        xa = context.make_array(signature.args[6])(context, builder, x_v)
        wa = context.make_array(signature.args[3])(context, builder, w_v)
        dp = builder.module.declare_intrinsic("llvm.x86.avx512.vpdpbusd.512", [], ir.FunctionType(vi, [vi, vi, vi]))
        flip = ir.Constant(v64b, [ir.Constant(i8, 0x80)] * 64)
        cat = ir.Constant(ir.VectorType(i32, 32), [ir.Constant(i32, j) for j in range(32)])
        # bytes of lane l: input u of the quad at position 4l + u; a = (u0 | u1), b = (u2 | u3) concatenated
        inter = ir.Constant(ir.VectorType(i32, 64), [ir.Constant(i32, (u // 2) * 32 + (u % 2) * 16 + l)
                                                    for l in range(16) for u in range(4)])
        ity = isum_off_v.type
        with cgutils.for_range(builder, nquads_v) as ql:
            t = ql.index
            parts = []
            for u in range(4):
                off = builder.add(w_off_v, builder.mul(builder.add(builder.mul(t, ir.Constant(ity, 4)), ir.Constant(ity, u)),
                                                       ir.Constant(ity, 128)))
                parts.append(builder.load(builder.bitcast(builder.gep(wa.data, [off]), v16b.as_pointer()), align=1))
            a = builder.shuffle_vector(parts[0], parts[1], cat)
            b = builder.shuffle_vector(parts[2], parts[3], cat)
            wv = builder.bitcast(builder.xor(builder.shuffle_vector(a, b, inter), flip), vi)
            with cgutils.for_range(builder, rows_v) as rl:
                r = rl.index
                pp = builder.bitcast(builder.gep(ia.data, [builder.add(isum_off_v, builder.mul(r, ir.Constant(ity, 128)))]),
                                     vi.as_pointer())
                xv = builder.load(builder.gep(xa.data, [builder.add(builder.add(x_off_v, builder.mul(r, x_stride_v)), t)]))
                acc = builder.load(pp, align=4)
                builder.store(builder.call(dp, [acc, wv, _splat(builder, xv, vi)]), pp, align=4)
        return context.get_dummy_value()

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
    nw = qt.shape[1]
    k_len = nw * (8 if bits == 4 else 1)
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
                for i0 in range(0, TILE, 16):
                    _fma_words(part, i0, rows, qt, (g * nw + k0 // 8) * TILE + i0, TILE, block // 8, x, k0, k_len)
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
# A faster mode beside the float one above: each activation row is rounded per block of the weight to
# int8 (xq = round(x / xd), xd = absmax / 127, as llama.cpp's Q8 activations), and a block's product is
# an integer dot product, 64 byte products per AVX512-VNNI instruction (vpdpbusd: unsigned x signed
# bytes summed in int32, exact; 4-bit codes are unsigned as stored, 8-bit codes are flipped to code + 128
# and 128 * sum(xq) is taken off), then
#     acc[r, i] += scale[i] * (xd[r, b] * isum[r, i]) - offset[i] * xs[r, b]     (xs: float sum of x)
# The weights are the same; the activations are rounded, so results differ from the float mode by that
# rounding (project/bench/cpu_packed.py --agreement reports top-1 agreement). Every row is still its own
# computation: row r of an R-row call equals the 1-row call bit for bit, so speculative decoding stays
# identical to target-alone decoding in this mode too; prefills take the same kernel, 16 rows at a time
# (a prompt position computed by a BLAS prefill in one run and by a verify in the other differed by the
# activation rounding and changed greedy texts). Blocks not a multiple of 4 keep the float path.

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


@njit(cache=True)
def quantize_rows(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover
    """(xq int8 (R, K), xd float32 (R, K / block), xs float32 (R, K / block), xqs int32 (R, K / block)):
    per block of each row, xd = absmax / 127, xq = round-half-even(x / xd), xs = the float sum of x (for
    the weights' offsets), xqs = the sum of xq (for the 8-bit codes' +128)."""
    rows, k_len = x.shape
    nb = k_len // block
    xq = np.empty((rows, k_len), dtype=np.int8)
    xd = np.empty((rows, nb), dtype=np.float32)
    xs = np.empty((rows, nb), dtype=np.float32)
    xqs = np.empty((rows, nb), dtype=np.int32)
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
            t = 0
            for k in range(b * block, (b + 1) * block):
                v = np.int8(np.rint(x[r, k] * inv))
                xq[r, k] = v
                t += v
            xqs[r, b] = t
    return xq, xd, xs, xqs


@njit(cache=True, parallel=True)
def packed_rows_q8(xq32: np.ndarray, xd: np.ndarray, xs: np.ndarray, xqs: np.ndarray, qt: np.ndarray, sc: np.ndarray,
                   d: np.ndarray, m: np.ndarray, dmin: np.ndarray, block: int, per: int, bits: int, n_len: int,
                   out: np.ndarray) -> None:  # pragma: no cover - numba
    """out (R, n_len) = the int8-activation product for the tiles of a PackedWeight (4-bit words, or 8-bit
    codes with a block that is a multiple of 4); xq32 is the (R, K / 4) int32 view of quantize_rows' xq."""
    groups = qt.shape[0]
    k_len = qt.shape[1] * (8 if bits == 4 else 1)
    nw = qt.shape[1]
    rows = xq32.shape[0]
    has_off = m.shape[1] > 0
    for g in prange(groups):
        acc = np.zeros((rows, TILE), dtype=np.float32)
        isum = np.empty((rows, TILE), dtype=np.int32)
        scale = np.empty(TILE, dtype=np.float32)
        offset = np.zeros(TILE, dtype=np.float32)
        for b in range(k_len // block):
            isum[:] = 0
            if bits == 4:
                for i0 in range(0, TILE, 16):
                    _dot_words(isum, i0, rows, qt, (g * nw + b * block // 8) * TILE + i0, TILE, block // 8,
                               xq32, b * block // 4, k_len // 4)
            else:
                for i0 in range(0, TILE, 16):
                    _dot_bytes(isum, i0, rows, qt, (g * k_len + b * block) * TILE + i0, block // 4,
                               xq32, b * block // 4, k_len // 4)
                for r in range(rows):
                    corr = np.int32(128) * xqs[r, b]
                    for i in range(TILE):
                        isum[r, i] -= corr
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


def int8_ready(w) -> bool:
    """Whether the int8-activation kernel takes this PackedWeight (4-bit words, or 8-bit codes in blocks
    of a multiple of 4: every GGUF type)."""
    return w.bits == 4 or w.block % 4 == 0


def packed_linear_q8(x: np.ndarray, w, out: np.ndarray) -> None:
    """The int8-activation product of a PackedWeight (int8_ready; x, out C-contiguous row blocks)."""
    xq, xd, xs, xqs = quantize_rows(x, w.block)
    packed_rows_q8(xq.view(np.int32), xd, xs, xqs, *w.tiles, w.block, w.per, w.bits, w.shape[0], out)


def packed_linear(x: np.ndarray, w, out: np.ndarray) -> None:
    """FastOps slot: out (R, N) = x (R, K) @ w^T for a PackedWeight w; x and out C-contiguous float32."""
    n_len, k_len = w.shape
    if _mode["activations"] == "int8" and int8_ready(w):
        # every row through the same per-row computation, prefill included (in chunks of MAX_ROWS): a
        # position gives the same bits whether a prefill, a verify or a decode step computes it, so
        # speculative decoding (which prefills prompt[:-1] and verifies the last prompt token) equals
        # target-alone decoding in this mode too
        for c in range(0, x.shape[0], MAX_ROWS):
            packed_linear_q8(x[c:c + MAX_ROWS], w, out[c:c + MAX_ROWS])
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
