"""numba kernel for FastOps' `packed_linear` slot: out (R, N) = x (R, K) @ w^T with w a PackedWeight.

Layout (minitorch/packed.py): TILE weight rows are interleaved, so for each input k the TILE codes of
a tile are adjacent. A thread owns whole tiles; for each block b of `block` inputs it sums, per output
lane i and activation row r, one fused multiply-add per input, in input order:

    part[r, i] = fma(q[i, k], x[r, k], part[r, i])       for k = first .. last input of b

(fma(a, b, c) = a * b + c rounded once; the loop over the TILE lanes is what vectorizes: one code ->
float32 convert and one vfmadd per 16 lanes, no horizontal sums; 4-bit codes come 8 inputs to a uint32
word, unpacked by shift and mask, and taken in the same input order; 6-bit codes 16 inputs to 3 words, two
of nibbles and one of the high 2 bits of u = code + 32, each code rebuilt exactly as u - 32 and taken in
the same input order), then folds the block's scale
(d * sc) and offset (dmin * m) in once:

    acc[r, i] += scale[i, b] * part[r, i] - offset[i, b] * sum_k x[r, k]     (same as sum of w[i, k] x[r, k])

The chain is the same whether the codes are nibbles, 6 bits or int8 and whatever the scales are stored as,
so the nibble and 6-bit forms give the int8 form's bits (tests/test_models_packed.py, test_packed_6bit.py).
It is compute-bound: one convert and one fma per weight and row; the int8-activation mode below replaces them by integer
dot products.

The weight is read from memory once per call whatever R is, at 1 + 8/block bytes per element instead of
float32's 4. The tile kernels below (LLVM IR) keep a block's partial sums in registers for a fixed row
count, take several 16-lane chunks at once for independent fma chains, turn nibbles into floats by a
table lookup, fold the block in vector code and prefetch ahead; none of it changes the chain above.
The fma is explicit (llvm.fma, exactly one rounding:
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

from ..packed import TILE, inputs

# up to this many activation rows use the row kernel (decode, verify of gamma <= 15); more use BLAS chunks
MAX_ROWS = 16
SPAN = 256  # inputs per tile-kernel call: its chunk passes stay within one 16-32 KB stretch of the tile
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


# ----------------------------------------------------------------------------- the tile kernels (LLVM IR)
# One call computes a whole tile (TILE outputs) for up to 16 activation rows over blocks b0..b1-1, adding
# each block's folded partial sum into acc (rows, TILE). It is written as IR so that the per-block work
# stays in vector registers: the row count is a compile-time constant of one of 16 specialised bodies
# (an IR switch picks it), so a block's partial sums are SSA values, not memory; the TILE lanes are
# taken C chunks of 16 at a time (C = 4 for one row, 2 for two to four, else 1: enough independent fma
# chains to hide the fma latency, few enough to stay in the 32 zmm registers); the block fold (scale,
# offset, acc) is done on the vectors in place, with the same operations, in the same order, as the numba
# loops it replaced. 4-bit codes become float32 by a table lookup (vpermps takes the low 4 bits of each
# lane's index, so `word >> shift` indexes the table [0, 1, ..., 15] directly: one instruction instead of
# mask + convert); 6-bit codes are first put together into one byte u = code + 32 per input, then each
# becomes the float 2^23 + u by a byte shuffle under the exponent bits, minus 2^23 + 32 (exact). A call
# covers SPAN inputs, so the chunk passes of one call stay inside a 16-32 KB stretch of the tile, and
# each pass prefetches its own columns one SPAN ahead (without the prefetch the strided passes left 5-8
# rows no faster than the loops before). Against those numba loops (block-major, partial sums in memory,
# per-block scalar fold), same process, real 1.5B products, 2 threads: 1 row 1.86x float / 1.41x int8
# (53.5 ms a forward: about the 19 GB/s this box streams), 5 rows 1.50x / 1.42x, bit for bit the same
# results.

_I32, _F32, _I8 = ir.IntType(32), ir.FloatType(), ir.IntType(8)
_VF, _VI, _VB = ir.VectorType(_F32, 16), ir.VectorType(_I32, 16), ir.VectorType(_I8, 16)


def host_avx512() -> bool:
    """Whether the host CPU has AVX-512 (32 zmm registers, vpermps on 16 lanes). Without it (e.g. AMD Zen 3,
    AVX2 only) LLVM splits each 16-lane vector into two 8-lane ymm halves and the x86 AVX-512 intrinsics
    cannot be selected at all (LLVM aborts the process: "Do not know how to split the result of this
    operator"), so the kernels below take generic IR there."""
    return "avx512f" in _isa()


def _isa() -> set[str]:
    """The host's instruction-set features the kernels choose by (llvmlite's view of the CPU). Setting
    MINITORCH_CPU_ISA=avx2 takes the AVX2 paths on an AVX-512 machine too, so that one box can test both
    (tests/test_packed_isa.py); numba's cache keys on the source, so use a fresh NUMBA_CACHE_DIR with it."""
    import os

    import llvmlite.binding as ll

    have = {k for k, v in ll.get_host_cpu_features().items() if v}
    if os.environ.get("MINITORCH_CPU_ISA", "").lower() == "avx2":
        have = {k for k in have if not k.startswith("avx512") and not k.startswith("amx")}
    return have


# Calls of SPLIT_ROWS rows or more (a prefill's chunks of MAX_ROWS, wide verifies) take their rows ROW_GROUP at a
# time, each group over the whole tile: without AVX-512 a body of 8 or 16 rows keeps more partial sums than the 16 ymm
# registers hold and spills them every input, while the codes a second group reads again come from L2. The row count
# of a body never changes a row's bits (every row is its own computation). Against one body for all rows (the 2-core
# Zen 3 box, the real 1.5B's products, variants alternating per round, same results;
# docs/results/cpu_zen3_row_groups/, now `python tools/cpu_kernel_ab.py --variants one16,base --rows 5,8,16`, one16
# being the single body): int8 activations, 16 rows gate / down / LM head 1.29x / 1.34x / 1.40x, 8 rows 1.21x / 1.06x
# / 0.96x; float32, 16 rows 1.87x / 1.74x, 8 rows 1.60x / 1.39x, but 5 rows as 4 + 1 0.82x / 0.71x (so fewer than
# SPLIT_ROWS rows stay one body). With AVX-512's 32 zmm registers the bodies are left as they were.
SPLIT_ROWS = 8
ROW_GROUP = 16 if host_avx512() else 4


def _chunks(rows: int, wide: bool = True) -> int:
    """16-lane chunks taken at once for `rows` rows: at least 8 independent chains where it fits. Without
    AVX-512 a chunk is two ymm registers of 16, so half as many chunks keep the sums in registers."""
    c = 8 if rows == 1 else 4 if rows <= 3 else 2 if rows <= 7 else 1
    return c if wide else max(1, c // 2)


def _vload(builder, base, off, vty, align=4):
    return builder.load(builder.bitcast(builder.gep(base, [off]), vty.as_pointer()), align=align)


def _vstore(builder, v, base, off, align=4):
    builder.store(v, builder.bitcast(builder.gep(base, [off]), v.type.as_pointer()), align=align)


def _tile_codegen(act: str, bits: int):
    """IR body builder of a tile kernel: act "f32" (float activations, fma chains) or "i8" (int8
    activations, vpdpbusd), bits 4 (uint32 words of 8 nibbles), 6 (3 uint32 words per 16 inputs: nibbles +
    high bits, minitorch/packed.py) or 8 (int8 codes)."""

    wide = host_avx512()
    vnni_hw = has_vnni()

    def codegen(context, builder, sig, args):
        (acc_v, r0, rows, qt_v, w_off, sc_v, m_v, s_off, d_v, dmin_v, d_off, b0, b1, block, per, has_off,
         x_v, x_stride, xs_v, xd_v, xqs_v, nb) = args
        ptr = {}
        for i, name in ((0, "acc"), (3, "qt"), (5, "sc"), (6, "m"), (8, "d"), (9, "dmin"), (16, "x"), (18, "xs"),
                        (19, "xd"), (20, "xqs")):
            ptr[name] = context.make_array(sig.args[i])(context, builder, args[i]).data
        ity = r0.type

        def c(n):
            return ir.Constant(ity, n)

        mod = builder.module
        fma_v = cgutils.get_or_insert_function(mod, ir.FunctionType(_VF, [_VF, _VF, _VF]), "llvm.fma.v16f32")
        perm = cgutils.get_or_insert_function(mod, ir.FunctionType(_VF, [_VF, _VI]), "llvm.x86.avx512.permvar.sf.512")
        vnni512 = cgutils.get_or_insert_function(mod, ir.FunctionType(_VI, [_VI, _VI, _VI]), "llvm.x86.avx512.vpdpbusd.512")
        _V32B, _V16H, _V8I = ir.VectorType(_I8, 32), ir.VectorType(ir.IntType(16), 16), ir.VectorType(_I32, 8)
        maddubs = cgutils.get_or_insert_function(mod, ir.FunctionType(_V16H, [_V32B, _V32B]), "llvm.x86.avx2.pmadd.ub.sw")
        maddwd = cgutils.get_or_insert_function(mod, ir.FunctionType(_V8I, [_V16H, _V16H]), "llvm.x86.avx2.pmadd.wd")
        psign = cgutils.get_or_insert_function(mod, ir.FunctionType(_V32B, [_V32B, _V32B]), "llvm.x86.avx2.psign.b")
        ones16 = ir.Constant(_V16H, [ir.Constant(ir.IntType(16), 1)] * 16)
        zero16 = ir.Constant(_V16H, None)
        halves = [ir.Constant(_V8I, [ir.Constant(_I32, 8 * h + j) for j in range(8)]) for h in (0, 1)]
        whole = ir.Constant(ir.VectorType(_I32, 16), [ir.Constant(_I32, j) for j in range(16)])

        def vnni(acc, w, xv):
            """acc[i] += sum over the 4 bytes of lane i of u8(w) * s8(xv): vpdpbusd with AVX512-VNNI; else
            (AVX2) per 8-lane half pmaddubsw (byte pairs into int16: a 4-bit code times |x| <= 127 cannot
            saturate) then pmaddwd against ones (int16 pairs into int32). Integer and exact either way."""
            if vnni_hw:
                return builder.call(vnni512, [acc, w, xv])
            parts = []
            for h in halves:
                wh = builder.bitcast(builder.shuffle_vector(w, w, h), _V32B)
                xh = builder.bitcast(builder.shuffle_vector(xv, xv, h), _V32B)
                parts.append(builder.call(maddwd, [builder.call(maddubs, [wh, xh]), ones16]))
            return builder.add(acc, builder.shuffle_vector(parts[0], parts[1], whole))

        def dot_signed(acc, w, xv):
            """acc[i] += sum over the 4 bytes of lane i of s8(w) * s8(xv), AVX2 (8-bit codes): pmaddubsw of |w|
            (<= 128, as u8) and xv with w's sign (|x| <= 127, so |pair| <= 32,512: no saturation)."""
            parts = []
            for h in halves:
                wh = builder.bitcast(builder.shuffle_vector(w, w, h), _V32B)
                xh = builder.bitcast(builder.shuffle_vector(xv, xv, h), _V32B)
                aw = builder.call(psign, [wh, wh])  # |w| (-128 stays 0x80 = 128 as u8)
                parts.append(builder.call(maddwd, [builder.call(maddubs, [aw, builder.call(psign, [xh, wh])]), ones16]))
            return builder.add(acc, builder.shuffle_vector(parts[0], parts[1], whole))
        pf = cgutils.get_or_insert_function(mod, ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), _I32, _I32, _I32]),
                                            "llvm.prefetch.p0i8")

        def prefetch(base, off):  # the same columns SPAN inputs on: the next call's pass reads them
            # into L2, not L1 (locality 2: prefetcht1). A prefetch into L1 holds one of the core's ~16 L1 fill
            # buffers until its line arrives, which capped the lines in flight per core; into L2 the L2's own,
            # larger miss queue tracks them. Against locality 3 (Sapphire Rapids VM box, 2 threads, the real
            # 1.5B's gate, down and LM head products, `python tools/cpu_kernel_ab.py --variants base,l1,none,nta
            # --mode int8|float32`, 20:53 UTC 2026-12-03): int8 activations 1 row 1.14-1.19x, 5 rows 1.06-1.17x;
            # float32 1 row 1.08-1.15x, 5 rows 1.01-1.15x. Without a prefetch the products ran at 0.60-0.83 of this
            # speed, non-temporal at 0.34-0.45; locality 1 and half or twice the distance were within 5% (scratch
            # copies, not in the tool)
            addr = builder.bitcast(builder.gep(base, [off]), ir.IntType(8).as_pointer())
            builder.call(pf, [addr, ir.Constant(_I32, 0), ir.Constant(_I32, 2), ir.Constant(_I32, 1)])

        table = ir.Constant(_VF, [ir.Constant(_F32, float(j)) for j in range(16)])
        # 6-bit codes, float mode: lane i of pick[t] takes byte t of lane i (u of its input 4c + t), then two zero
        # bytes and 0x4B from magic_bytes: the float32 bits of 2^23 + u; magic32 = 2^23 + 32
        _V64B = ir.VectorType(_I8, 64)
        magic_bytes = ir.Constant(_V64B, [ir.Constant(_I8, 0x4B if j == 1 else 0) for j in range(64)])
        pick = [ir.Constant(ir.VectorType(_I32, 64), [ir.Constant(_I32, v) for i in range(16)
                                                      for v in (4 * i + t, 64, 64, 65)]) for t in range(4)]
        magic32 = ir.Constant(_VF, [ir.Constant(_F32, float(2 ** 23 + 32))] * 16)

        def vconst(n):  # n in all 16 int32 lanes
            return ir.Constant(_VI, [ir.Constant(_I32, n)] * 16)

        hmask = vconst(0x30303030)  # bits 4-5 of each byte: where a 6-bit code's high bits go
        nib = ir.Constant(_VI, [ir.Constant(_I32, 0x0F0F0F0F)] * 16)
        low4 = ir.Constant(_VI, [ir.Constant(_I32, 15)] * 16)
        four = ir.Constant(_VI, [ir.Constant(_I32, 4)] * 16)
        flip = ir.Constant(ir.VectorType(_I8, 64), [ir.Constant(_I8, 0x80)] * 64)
        cat = ir.Constant(ir.VectorType(_I32, 32), [ir.Constant(_I32, j) for j in range(32)])
        inter = ir.Constant(ir.VectorType(_I32, 64), [ir.Constant(_I32, (u // 2) * 32 + (u % 2) * 16 + lane)
                                                      for lane in range(16) for u in range(4)])
        vzero_f = ir.Constant(_VF, None)
        vzero_i = ir.Constant(_VI, None)
        has_off_b = builder.icmp_signed("!=", has_off, c(0))
        acc_ty = _VF if act == "f32" else _VI
        # The int8 mode's fold of a block of 6-bit or 8-bit codes (Q6_K: 16 inputs a block; its int8-code form must give
        # the same bits) into the accumulator: acc + (scale * xd) * float(isum) - offset * xs as two fmas rather than
        # acc + (scale * (xd * float(isum)) - offset * xs), three multiplies, a subtract and an add: the same definition
        # to float32 rounding (tests/test_packed_int8.py), fewer instructions a row and block. 2-core Zen 3, the real
        # 1.5B's products (docs/results/cpu_zen3_fold/; the old fold is the tool's probe `xsep`): down (half its
        # layers 6-bit) / the LM head (6-bit) at 4 rows 1.15x / 1.34x faster, at 1 row 1.02x; a whole int8 forward of 5
        # rows (a verify) 1.19x, of 1 row 1.05x (`--step`). The 4-bit gate and up were 1.01-1.03x slower with the fmas,
        # so 4-bit codes keep the old form.
        fma_fold = act == "i8" and bits in (6, 8)

        def splat(v, vty):
            u = builder.insert_element(ir.Constant(vty, ir.Undefined), v, ir.Constant(_I32, 0))
            return builder.shuffle_vector(u, ir.Constant(vty, ir.Undefined),
                                          ir.Constant(ir.VectorType(_I32, 16), [ir.Constant(_I32, 0)] * 16))

        def body(R: int) -> None:
            C = _chunks(R, wide)
            slots = [[cgutils.alloca_once(builder, acc_ty) for _ in range(C)] for _ in range(R)]
            acc16 = [[[cgutils.alloca_once(builder, _V16H) for _ in (0, 1)] for _ in range(C)] for _ in range(R)]
            xrow = [builder.mul(builder.add(r0, c(r)), x_stride) for r in range(R)]
            srow = [builder.mul(builder.add(r0, c(r)), nb) for r in range(R)]
            arow = [builder.mul(builder.add(r0, c(r)), c(TILE)) for r in range(R)]
            # block outside, lane chunks inside: a block's words are read whole (all TILE lanes, 512 contiguous
            # bytes a word) before the next block's; with the lane chunks outside, each pass read half of every
            # row of the span (AVX2 box, 2 threads, real 1.5B products: 1 row 1.27x float / 1.22x int8, same bits)
            with cgutils.for_range_slice(builder, b0, b1, c(1)) as (b, _):
                with cgutils.for_range(builder, c(TILE // (16 * C))) as cl:
                    lane0 = builder.mul(cl.index, c(16 * C))
                    for r in range(R):
                        for j in range(C):
                            builder.store(vzero_f if act == "f32" else vzero_i, slots[r][j])
                            for h in (0, 1):
                                builder.store(zero16, acc16[r][j][h])
                    if bits == 4:
                        wpb = builder.sdiv(block, c(8))
                        with cgutils.for_range(builder, wpb) as wl:
                            t = builder.add(builder.mul(b, wpb), wl.index)
                            wbase = builder.add(w_off, builder.mul(t, c(TILE)))
                            wvs = [_vload(builder, ptr["qt"], builder.add(wbase, builder.add(lane0, c(16 * j))), _VI)
                                   for j in range(C)]
                            for j in range(C):
                                prefetch(ptr["qt"], builder.add(wbase, builder.add(lane0, c(16 * j + SPAN // 8 * TILE))))
                            if act == "f32":
                                xb = [builder.add(xrow[r], builder.mul(t, c(8))) for r in range(R)]
                                accs = [[builder.load(slots[r][j]) for j in range(C)] for r in range(R)]
                                for n, sh in enumerate((0, 8, 16, 24, 4, 12, 20, 28)):
                                    xv = [splat(builder.load(builder.gep(ptr["x"], [builder.add(xb[r], c(n))])), _VF)
                                          for r in range(R)]
                                    for j in range(C):
                                        idx = wvs[j] if sh == 0 else builder.lshr(
                                            wvs[j], ir.Constant(_VI, [ir.Constant(_I32, sh)] * 16))
                                        if wide:  # vpermps reads the low 4 bits of each index
                                            code = builder.call(perm, [table, idx])
                                        else:  # generic IR: mask, then an exact int -> float convert
                                            code = builder.sitofp(builder.and_(idx, low4), _VF)
                                        for r in range(R):
                                            accs[r][j] = builder.call(fma_v, [code, xv[r], accs[r][j]])
                                for r in range(R):
                                    for j in range(C):
                                        builder.store(accs[r][j], slots[r][j])
                            else:  # low and high nibbles into one integer sum (exact, so order-free). Until stop 69
                                #    the high nibbles had a sum of their own: 2 R C int32 sums, which at 16 rows (a
                                #    prefill's chunks) are more than the 32 zmm registers; one sum ran gate's 16 rows
                                #    2.4x faster, 1 and 4 rows within 0.94-1.05x (2-core Zen 4, the real 1.5B, `python
                                #    tools/cpu_kernel_ab.py --variants base,sep4 --classes gate,down,head --rows
                                #    1,4,8,12,16`; docs/results/cpu_zen4_specbench_10_prefill_kernel/), same bits
                                xo = [builder.add(xrow[r], builder.mul(t, c(2))) for r in range(R)]
                                xlo = [splat(builder.load(builder.gep(ptr["x"], [xo[r]])), _VI) for r in range(R)]
                                xhi = [splat(builder.load(builder.gep(ptr["x"], [builder.add(xo[r], c(1))])), _VI)
                                       for r in range(R)]
                                for j in range(C):
                                    lo = builder.and_(wvs[j], nib)
                                    hi = builder.and_(builder.lshr(wvs[j], four), nib)
                                    for r in range(R):
                                        if vnni_hw:
                                            builder.store(vnni(builder.load(slots[r][j]), lo, xlo[r]), slots[r][j])
                                            builder.store(vnni(builder.load(slots[r][j]), hi, xhi[r]), slots[r][j])
                                            continue
                                        # AVX2: pmaddubsw's int16 pair sums (|.| <= 2 * 15 * 127 = 3,810) add up
                                        # in int16 over up to 4 words (8 of them, <= 30,480: no overflow), and
                                        # only then widen by pmaddwd (below): half the multiplies of widening
                                        # every word, the same integer sum
                                        for h in (0, 1):
                                            wl_, wh_ = (builder.bitcast(builder.shuffle_vector(v, v, halves[h]), _V32B)
                                                        for v in (lo, hi))
                                            xl_, xh_ = (builder.bitcast(builder.shuffle_vector(v, v, halves[h]), _V32B)
                                                        for v in (xlo[r], xhi[r]))
                                            a16 = builder.add(builder.call(maddubs, [wl_, xl_]),
                                                              builder.call(maddubs, [wh_, xh_]))
                                            builder.store(builder.add(builder.load(acc16[r][j][h]), a16), acc16[r][j][h])
                                if not vnni_hw:  # every 4th word and the block's last: widen into the int32 sums
                                    last = builder.icmp_signed("==", wl.index, builder.sub(wpb, c(1)))
                                    fourth = builder.icmp_signed("==", builder.and_(wl.index, c(3)), c(3))
                                    with builder.if_then(builder.or_(last, fourth)):
                                        for r in range(R):
                                            for j in range(C):
                                                parts16 = [builder.call(maddwd, [builder.load(acc16[r][j][h]), ones16])
                                                           for h in (0, 1)]
                                                builder.store(builder.add(builder.load(slots[r][j]), builder.shuffle_vector(
                                                    parts16[0], parts16[1], whole)), slots[r][j])
                                                for h in (0, 1):
                                                    builder.store(zero16, acc16[r][j][h])
                    elif bits == 6:  # per 16 inputs: two nibble words (low 4 bits of u = code + 32) + a word of high bits
                        gpb = builder.sdiv(block, c(16))
                        with cgutils.for_range(builder, gpb) as gl:
                            s16 = builder.add(builder.mul(b, gpb), gl.index)  # 16-input group
                            wbase = builder.add(w_off, builder.mul(s16, c(3 * TILE)))

                            def words(h):  # the C 16-lane vectors of word h (0, 1: nibbles; 2: high bits)
                                return [_vload(builder, ptr["qt"], builder.add(wbase, builder.add(
                                    lane0, c(h * TILE + 16 * j))), _VI) for j in range(C)]

                            for h in range(3):
                                for j in range(C):
                                    prefetch(ptr["qt"], builder.add(wbase, builder.add(lane0, c(
                                        h * TILE + 16 * j + SPAN * 3 // 16 * TILE))))
                            nw0, nw1, hws = words(0), words(1), words(2)

                            def group(j, g):  # chunk j's u = code + 32 (0..63) for inputs 4g .. 4g + 3, one byte an
                                #               input (byte t of a lane: input 4g + t): the low nibble from a nibble
                                #               word, the high bits put at bits 4-5 by one shift of the high word
                                lo = (nw0, nw1)[g // 2][j]
                                lo = builder.lshr(lo, four) if g % 2 else lo
                                hi = hws[j] if g == 2 else (builder.shl(hws[j], vconst(4 - 2 * g)) if g < 2
                                                            else builder.lshr(hws[j], vconst(2)))
                                return builder.or_(builder.and_(lo, nib), builder.and_(hi, hmask))

                            if act == "f32":  # each input's u as the float 2^23 + u (its byte under the exponent
                                # bits 0x4B000000: vpshufb + vpor), minus 2^23 + 32: the code, exact. Per input and 16
                                # lanes that is 3 instructions + the group's share of building u against the int8
                                # form's 2 (vpmovsxbd from memory, vcvtdq2ps), so the float mode's products are
                                # compute-bound slower per weight (one thread, real 1.5B down / LM head, 1 row: 0.65-0.73x
                                # the int8 form's speed; two table lookups added 0.54-0.59x; bfloat16 bytes by vpermb
                                # lookups + a zero-masked vpermt2b a input 0.57-0.65x: LLVM made the mask a vpandq);
                                # with two threads the fewer bytes make up for part of it (docs/history/RESULTS_LOG.md)
                                accs = [[builder.load(slots[r][j]) for j in range(C)] for r in range(R)]
                                for i in range(16):  # in input order
                                    if i % 4 == 0:
                                        us = [builder.bitcast(group(j, i // 4), _V64B) for j in range(C)]
                                    xv = [splat(builder.load(builder.gep(ptr["x"], [builder.add(
                                        xrow[r], builder.add(builder.mul(s16, c(16)), c(i)))])), _VF) for r in range(R)]
                                    for j in range(C):
                                        fb = builder.shuffle_vector(us[j], magic_bytes, pick[i % 4])
                                        code = builder.fsub(builder.bitcast(fb, _VF), magic32)
                                        for r in range(R):
                                            accs[r][j] = builder.call(fma_v, [code, xv[r], accs[r][j]])
                                for r in range(R):
                                    for j in range(C):
                                        builder.store(accs[r][j], slots[r][j])
                            else:  # u (0..63) bytes times the int8 activations, 4 inputs a lane; the fold takes
                                #    32 * sum(xq) off (u = code + 32), so the integer sum is the int8 form's
                                xo = [builder.add(xrow[r], builder.mul(s16, c(4))) for r in range(R)]
                                xg = [[splat(builder.load(builder.gep(ptr["x"], [builder.add(xo[r], c(g))])), _VI)
                                       for g in range(4)] for r in range(R)]
                                for j in range(C):
                                    for g in range(4):
                                        u = group(j, g)
                                        for r in range(R):  # AVX2: |u * x| pairs <= 2 * 63 * 127 = 16,002, no saturation
                                            builder.store(vnni(builder.load(slots[r][j]), u, xg[r][g]), slots[r][j])
                    elif act == "f32":  # int8 codes, one input at a time
                        k0 = builder.mul(b, block)
                        with cgutils.for_range(builder, block) as kl:
                            k = builder.add(k0, kl.index)
                            wbase = builder.add(w_off, builder.mul(k, c(TILE)))
                            for j in range(0, C, 4):
                                prefetch(ptr["qt"], builder.add(wbase, builder.add(lane0, c(16 * j + SPAN * TILE))))
                            for j in range(C):
                                cv = builder.sitofp(_vload(builder, ptr["qt"], builder.add(wbase, builder.add(lane0, c(16 * j))),
                                                           _VB, 1), _VF)
                                for r in range(R):
                                    xv = builder.load(builder.gep(ptr["x"], [builder.add(xrow[r], k)]))
                                    builder.store(builder.call(fma_v, [cv, splat(xv, _VF), builder.load(slots[r][j])]),
                                                  slots[r][j])
                    else:  # int8 codes, 4 inputs per vpdpbusd (flipped to code + 128)
                        q0 = builder.sdiv(builder.mul(b, block), c(4))
                        with cgutils.for_range(builder, builder.sdiv(block, c(4))) as ql:
                            q = builder.add(q0, ql.index)
                            for u in range(4):
                                for j in range(0, C, 4):
                                    prefetch(ptr["qt"], builder.add(builder.add(w_off, builder.mul(builder.add(
                                        builder.mul(q, c(4)), c(u + SPAN)), c(TILE))), builder.add(lane0, c(16 * j))))
                            for j in range(C):
                                parts = [_vload(builder, ptr["qt"], builder.add(
                                    builder.add(w_off, builder.mul(builder.add(builder.mul(q, c(4)), c(u)), c(TILE))),
                                    builder.add(lane0, c(16 * j))), _VB, 1) for u in range(4)]
                                lo2 = builder.shuffle_vector(parts[0], parts[1], cat)
                                hi2 = builder.shuffle_vector(parts[2], parts[3], cat)
                                wv = builder.shuffle_vector(lo2, hi2, inter)
                                if vnni_hw:  # flipped to code + 128 (u8); 128 * sum(xq) comes off in the fold
                                    wv = builder.bitcast(builder.xor(wv, flip), _VI)
                                else:
                                    wv = builder.bitcast(wv, _VI)
                                for r in range(R):
                                    xv = builder.load(builder.gep(ptr["x"], [builder.add(xrow[r], q)]))
                                    fn = vnni if vnni_hw else dot_signed
                                    builder.store(fn(builder.load(slots[r][j]), wv, splat(xv, _VI)), slots[r][j])
                    # fold the block in: acc += scale * part - offset * xs[r, b]  (int8: part = xd * float(isum))
                    s = builder.sdiv(b, per)
                    sb = builder.add(builder.add(s_off, builder.mul(b, c(TILE))), lane0)
                    db = builder.add(builder.add(d_off, builder.mul(s, c(TILE))), lane0)
                    scale = [builder.fmul(_vload(builder, ptr["d"], builder.add(db, c(16 * j)), _VF),
                                          builder.sitofp(_vload(builder, ptr["sc"], builder.add(sb, c(16 * j)), _VB, 1), _VF))
                             for j in range(C)]
                    parts, xds = [], []
                    for r in range(R):
                        xsb = builder.load(builder.gep(ptr["xs"], [builder.add(srow[r], b)]))
                        if act == "f32":
                            parts.append([builder.load(slots[r][j]) for j in range(C)])
                        else:
                            xdb = splat(builder.load(builder.gep(ptr["xd"], [builder.add(srow[r], b)])), _VF)
                            isums = [builder.load(slots[r][j]) for j in range(C)]
                            if (bits == 8 and vnni_hw) or bits == 6:  # codes stored as code + 128 / code + 32
                                corr = builder.mul(builder.load(builder.gep(ptr["xqs"], [builder.add(srow[r], b)])),
                                                   ir.Constant(_I32, 128 if bits == 8 else 32))
                                isums = [builder.sub(v, splat(corr, _VI)) for v in isums]
                            if fma_fold:
                                parts.append([builder.sitofp(v, _VF) for v in isums])
                                xds.append(xdb)
                            else:
                                parts.append([builder.fmul(xdb, builder.sitofp(v, _VF)) for v in isums])
                        parts[r].append(xsb)

                    def fold(offsets):
                        for r in range(R):
                            xsv = splat(parts[r][C], _VF)
                            for j in range(C):
                                ao = builder.add(arow[r], builder.add(lane0, c(16 * j)))
                                if fma_fold:  # acc + (scale * xd) * isum - offset * xs, two fmas
                                    a = builder.call(fma_v, [builder.fmul(scale[j], xds[r]), parts[r][j],
                                                             _vload(builder, ptr["acc"], ao, _VF)])
                                    if offsets is not None:
                                        a = builder.call(fma_v, [builder.fneg(offsets[j]), xsv, a])
                                    _vstore(builder, a, ptr["acc"], ao)
                                    continue
                                term = builder.fmul(scale[j], parts[r][j])
                                if offsets is not None:
                                    term = builder.fsub(term, builder.fmul(offsets[j], xsv))
                                _vstore(builder, builder.fadd(_vload(builder, ptr["acc"], ao, _VF), term), ptr["acc"], ao)

                    with builder.if_else(has_off_b) as (then, otherwise):
                        with then:
                            fold([builder.fmul(_vload(builder, ptr["dmin"], builder.add(db, c(16 * j)), _VF),
                                               builder.sitofp(_vload(builder, ptr["m"], builder.add(sb, c(16 * j)), _VB, 1), _VF))
                                  for j in range(C)])
                        with otherwise:
                            # float mode: acc += scale * part; int8 mode keeps its offset term with offset 0 (the two
                            # fmas: none)
                            fold(None if act == "f32" or fma_fold else [vzero_f] * C)

        done = builder.append_basic_block("tile.done")
        sw = builder.switch(rows, done)
        for R in range(1, 17):
            bb = builder.append_basic_block(f"tile.rows{R}")
            sw.add_case(c(R), bb)
            builder.position_at_end(bb)
            body(R)
            builder.branch(done)
        builder.position_at_end(done)
        return context.get_dummy_value()

    return codegen


def _tile_intrinsic(act: str, bits: int):
    def impl(typingctx, acc, r0, rows, qt, w_off, sc, m, s_off, d, dmin, d_off, b0, b1, block, per, has_off,
             x, x_stride, xs, xd, xqs, nb):  # pragma: no cover - numba
        ip = types.intp
        sig = types.void(acc, ip, ip, qt, ip, sc, m, ip, d, dmin, ip, ip, ip, ip, ip, ip, x, ip, xs, xd, xqs, ip)
        return sig, _tile_codegen(act, bits)

    impl.__name__ = f"_tile_{act}_q{bits}"
    return intrinsic(impl)


_tile_f32_q4 = _tile_intrinsic("f32", 4)
_tile_f32_q6 = _tile_intrinsic("f32", 6)
_tile_f32_q8 = _tile_intrinsic("f32", 8)
_tile_i8_q4 = _tile_intrinsic("i8", 4)
_tile_i8_q6 = _tile_intrinsic("i8", 6)
_tile_i8_q8 = _tile_intrinsic("i8", 8)


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


_inputs = njit(cache=True)(inputs)  # K from a tile row's code entries, inside the kernels below


@njit(cache=True, parallel=True)
def packed_rows(x: np.ndarray, qt: np.ndarray, sc: np.ndarray, d: np.ndarray, m: np.ndarray, dmin: np.ndarray,
                block: int, per: int, bits: int, n_len: int, out: np.ndarray) -> None:  # pragma: no cover - numba
    """out (R, n_len) = x (R, K) @ w^T for the tiles of a PackedWeight (packed.py): codes qt (int8, or
    uint32 words of 8 nibbles for bits 4, of 6-bit codes for bits 6), block scales sc / m under super-block
    factors d / dmin."""
    groups = qt.shape[0]
    nw = qt.shape[1]
    k_len = _inputs(nw, bits)
    rows = x.shape[0]
    nb = k_len // block
    ns = nb // per
    has_off = 1 if m.shape[1] > 0 else 0
    bstep = max(1, SPAN // block)
    xs = _block_sums(x, block)
    for g in prange(groups):
        acc = np.zeros((rows, TILE), dtype=np.float32)
        step = 16 if rows < SPLIT_ROWS else ROW_GROUP
        for r0 in range(0, rows, step):
            rr = min(step, rows - r0)
            for b0 in range(0, nb, bstep):
                b1 = min(b0 + bstep, nb)
                if bits == 4:
                    _tile_f32_q4(acc, r0, rr, qt, g * nw * TILE, sc, m, g * nb * TILE, d, dmin, g * ns * TILE, b0, b1,
                                 block, per, has_off, x, k_len, xs, xs, xs, nb)
                elif bits == 6:
                    _tile_f32_q6(acc, r0, rr, qt, g * nw * TILE, sc, m, g * nb * TILE, d, dmin, g * ns * TILE, b0, b1,
                                 block, per, has_off, x, k_len, xs, xs, xs, nb)
                else:
                    _tile_f32_q8(acc, r0, rr, qt, g * nw * TILE, sc, m, g * nb * TILE, d, dmin, g * ns * TILE, b0, b1,
                                 block, per, has_off, x, k_len, xs, xs, xs, nb)
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
    nw = qt.shape[1]
    k_len = _inputs(nw, bits)
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
                elif bits == 6:  # u = low 4 bits | high 2 bits << 4, code = u - 32 (minitorch/packed.py)
                    t = k % 16
                    src = qt[g, 3 * (k // 16) + t // 8]
                    hsrc = qt[g, 3 * (k // 16) + 2]
                    sh = 8 * (t % 4) + 4 * ((t % 8) // 4)
                    sh2 = 8 * (t % 4) + 2 * (t // 4)
                    for i in range(TILE):
                        u = ((np.int64(src[i]) >> sh) & 15) | (((np.int64(hsrc[i]) >> sh2) & 3) << 4)
                        row[i] = a[i] * np.float32(u - 32) - c[i]
                else:
                    src8 = qt[g, k]
                    for i in range(TILE):
                        row[i] = a[i] * np.float32(src8[i]) - c[i]


# ----------------------------------------------------------------------------- int8 activations (VNNI)
# A faster mode beside the float one above: each activation row is rounded per block of the weight to
# int8 (xq = round(x / xd), xd = absmax / 127, as llama.cpp's Q8 activations), and a block's product is
# an integer dot product, 64 byte products per AVX512-VNNI instruction (vpdpbusd: unsigned x signed
# bytes summed in int32, exact; 4-bit codes are unsigned as stored, 6-bit ones are stored as code + 32, a
# nibble and its 2 high bits put together into one byte per input (0..63), and 32 * sum(xq) is taken off;
# 8-bit codes are flipped to code + 128 and 128 * sum(xq) is taken off), then
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
    _check_mode(mode)
    old, _mode["activations"] = _mode["activations"], mode
    return old


def _check_mode(mode: str) -> None:
    if mode not in ACTIVATIONS:
        raise ValueError(f"packed activations must be one of {', '.join(ACTIVATIONS)}, got {mode!r}")
    if mode == "int8" and not int8_supported():
        raise ValueError("int8 activations need an x86 CPU with AVX2 (or AVX512-VNNI)")


def get_activations() -> str:
    return _mode["activations"]


def set_weight_activations(weights, mode: Optional[str]) -> None:
    """The activation mode of these PackedWeights alone (None: back to the process's mode), checked as
    set_activations checks it; the weights of one model then compute in their own mode whatever the process's."""
    if mode is not None:
        _check_mode(mode)
    for w in weights:
        w.activations = mode


def has_vnni() -> bool:
    """AVX512-VNNI (vpdpbusd on 16 int32 lanes; with AVX-512 itself)."""
    return {"avx512vnni", "avx512f", "avx512bw"} <= _isa()


def int8_supported() -> bool:
    """Whether the int8-activation kernel runs here: AVX512-VNNI, or AVX2 (pmaddubsw + pmaddwd)."""
    return has_vnni() or "avx2" in _isa()


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
    """out (R, n_len) = the int8-activation product for the tiles of a PackedWeight (4-bit or 6-bit words, or
    8-bit codes with a block that is a multiple of 4); xq32 is the (R, K / 4) int32 view of quantize_rows' xq."""
    groups = qt.shape[0]
    nw = qt.shape[1]
    k_len = _inputs(nw, bits)
    rows = xq32.shape[0]
    nb = k_len // block
    ns = nb // per
    has_off = 1 if m.shape[1] > 0 else 0
    bstep = max(1, SPAN // block)
    for g in prange(groups):
        acc = np.zeros((rows, TILE), dtype=np.float32)
        step = 16 if rows < SPLIT_ROWS else ROW_GROUP
        for r0 in range(0, rows, step):
            rr = min(step, rows - r0)
            for b0 in range(0, nb, bstep):
                b1 = min(b0 + bstep, nb)
                if bits == 4:
                    _tile_i8_q4(acc, r0, rr, qt, g * nw * TILE, sc, m, g * nb * TILE, d, dmin, g * ns * TILE, b0, b1,
                                 block, per, has_off, xq32, k_len // 4, xs, xd, xqs, nb)
                elif bits == 6:
                    _tile_i8_q6(acc, r0, rr, qt, g * nw * TILE, sc, m, g * nb * TILE, d, dmin, g * ns * TILE, b0, b1,
                                 block, per, has_off, xq32, k_len // 4, xs, xd, xqs, nb)
                else:
                    _tile_i8_q8(acc, r0, rr, qt, g * nw * TILE, sc, m, g * nb * TILE, d, dmin, g * ns * TILE, b0, b1,
                                 block, per, has_off, xq32, k_len // 4, xs, xd, xqs, nb)
        mm = min(TILE, n_len - g * TILE)
        for r in range(rows):
            for i in range(mm):
                out[r, g * TILE + i] = acc[r, i]


def int8_ready(w) -> bool:
    """Whether the int8-activation kernel takes this PackedWeight (4-bit or 6-bit words, or 8-bit codes in
    blocks of a multiple of 4: every GGUF type)."""
    return w.bits == 4 or w.block % 4 == 0


def packed_linear_q8(x: np.ndarray, w, out: np.ndarray) -> None:
    """The int8-activation product of a PackedWeight (int8_ready; x, out C-contiguous row blocks)."""
    xq, xd, xs, xqs = quantize_rows(x, w.block)
    packed_rows_q8(xq.view(np.int32), xd, xs, xqs, *w.tiles, w.block, w.per, w.bits, w.shape[0], out)


def packed_linear(x: np.ndarray, w, out: np.ndarray) -> None:
    """FastOps slot: out (R, N) = x (R, K) @ w^T for a PackedWeight w; x and out C-contiguous float32."""
    n_len, k_len = w.shape
    if (w.activations or _mode["activations"]) == "int8" and int8_ready(w):
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
