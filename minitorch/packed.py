"""Packed (block-quantized) weights: a (N, K) matrix kept in the form a GGUF file stores it.

    w[n, k] = scale[n, b] * q[n, k] - offset[n, b]        b = k // block   (float32, two roundings)
    scale[n, b] = d[n, b // per] * sc[n, b]               offset[n, b] = dmin[n, b // per] * m[n, b]

q holds small integer codes, sc and m small integer block scales and minimums (int8), d and dmin one
float32 each per super-block of `per` blocks. Every GGUF type we read (Q4_0/1, Q5_0/1, Q8_0, Q4_K, Q5_K,
Q6_K) fits this form: a K-quant's 6/8-bit sub-block scales are sc and m under its fp16 d and dmin (per 8
or 16 blocks); the simple types have per 1, sc 1 (d * 1 is d) and their fp16 d. Every product and the
difference are rounded separately, in float32, exactly as the gguf library's dequantizers compute them,
so the float32 weights rebuilt here are bit for bit the weights of the float32 model (tests check it).

Codes of 0..15 (Q4_K, Q4_1) are kept as nibbles, two inputs per byte (`bits` 4); codes of -32..31 (Q6_K,
Q5_K, Q5_0, Q5_1, Q4_0) as 6 bits, a nibble plus 2 high bits (`bits` 6); others (Q8_0) as int8 (`bits` 8).
A Q4_K weight then reads 0.5 + 2/32 + 8/256 = 0.59 bytes (the file's Q4_K: 0.5625) and a Q6_K one 0.75 +
1/16 + 4/256 = 0.83 bytes (the file: 0.82; as int8 codes it read 1.08), where the previous form (int8
codes + float32 scale and offset per block) read 1.25 and 1.5. A packed model holds about a fifth of the
float32 model's memory.

The weights are the model's own, not a new quantization: outputs differ from the float32 path only by
summation order. Stored in tiles of TILE interleaved rows (below), minitorch/cpu/packed.py's kernel converts and
multiplies 8-16 adjacent outputs per vector instruction with no horizontal sums. `load_model(weights=
"auto")`, the default, picks it for GGUF files on backends with a packed kernel.

Inference only: a packed weight has no gradient. `nn.linear` and `nn.embedding` accept one in place of
a weight tensor; backends run it through their `packed_linear` slot (FastOps: minitorch/cpu/packed.py's numba
kernel; SimpleOps: dequantize, then numpy matmul, the reference).
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .tensor_data import MiniTorchError


TILE = 128  # weight rows interleaved per tile (the kernel's vector lanes); N is padded up to a multiple


class PackedWeight:
    """A (N, K) float32 weight stored as integer codes with per-block integer scales under per-super-block
    float32 factors (see module doc).

    Storage is tiled: TILE consecutive weight rows are interleaved, so that for every input k the codes
    of those rows lie next to each other and a vector instruction serves several adjacent outputs.
        bits 8:  qt[g, k, i]      = q[g * TILE + i, k]                          (G, K, TILE) int8
        bits 4:  qt[g, j, i]      = 8 codes of row g * TILE + i in one uint32:  (G, K / 8, TILE) uint32
                                    byte t (0..3) = q[., 8j + t] | q[., 8j + 4 + t] << 4
                 (one 64-byte load gives 16 rows x 8 inputs; the low nibbles of a word are 4 consecutive
                 inputs, as an int8 dot-product instruction wants them, the high nibbles the next 4)
        bits 6:  qt[g, 3s + h, i] = 16 codes of row g * TILE + i in 3 uint32:  (G, 3 K / 16, TILE) uint32
                                    u = q + 32 (0..63) for inputs 16s .. 16s + 15, as
                                    h = 0, 1: the low 4 bits of u[16s + 8h ..] as bits 4 words (above)
                                    h = 2:    byte t = sum over c (0..3) of (u[16s + 4c + t] >> 4) << 2c
                 (the high word's bits 2c..2c+1 of each byte belong to the inputs of the 4-input group c
                 the nibble words give, so one shift and mask per group puts them above its nibbles)
                 sc[g, b, i]      = sc[g * TILE + i, b]                         (G, K / block, TILE) int8
                 d[g, s, i]       = d[g * TILE + i, s]                          (G, K / (block * per), TILE) f32
                 m, dmin          like sc, d; with a second dimension of 0 when every offset is 0
    G = ceil(N / TILE); rows past N (padding of the last tile) hold zeros.
    """

    dims = 2
    dtype = "packed"
    requires_grad = False

    def __init__(self, q: np.ndarray, scale: np.ndarray, offset: np.ndarray, block: int,
                 bits: Optional[int] = None) -> None:
        """From row-major codes q (N, K) and float32 scale / offset (N, K / block): per 1, sc 1, d = scale,
        m 1, dmin = offset (multiplying by 1 is exact, so the values are these scales and offsets)."""
        for label, arr in (("scale", scale), ("offset", offset)):
            want = (q.shape[0], q.shape[1] // max(int(block), 1)) if q.ndim == 2 else None
            if arr.shape != want or arr.dtype != np.float32:
                raise MiniTorchError(f"packed {label} must be float32 of shape {want}, got {arr.dtype} {arr.shape}")
        has_off = bool(np.any(offset != 0))
        ones = np.ones(scale.shape, dtype=np.int8)
        self._from_rows(q, block, 1, ones, scale, ones if has_off else None, offset if has_off else None, bits)

    @classmethod
    def from_blocks(cls, q: np.ndarray, block: int, per: int, sc: np.ndarray, d: np.ndarray,
                    m: Optional[np.ndarray] = None, dmin: Optional[np.ndarray] = None,
                    bits: Optional[int] = None) -> "PackedWeight":
        """From row-major codes q (N, K) int8, sc / m (N, K / block) int8 and d / dmin (N, K / (block * per))
        float32, as a GGUF file's blocks hold them (m, dmin None: no offsets). bits None: 4 if the codes
        fit 0..15 and the block is a multiple of 8, else 6 if they fit -32..31 and the block is a multiple
        of 16, else 8."""
        pw = cls.__new__(cls)
        pw._from_rows(q, block, per, sc, d, m, dmin, bits)
        return pw

    def _from_rows(self, q: np.ndarray, block: int, per: int, sc: np.ndarray, d: np.ndarray,
                   m: Optional[np.ndarray], dmin: Optional[np.ndarray], bits: Optional[int]) -> None:
        if q.ndim != 2 or q.dtype != np.int8:
            raise MiniTorchError(f"packed codes must be a 2-d int8 array, got {q.dtype} of shape {q.shape}")
        n, k = q.shape
        block, per = int(block), int(per)
        if block < 1 or per < 1 or k % (block * per):
            raise MiniTorchError(f"packed block {block} x {per} does not divide the {k} inputs")
        if (m is None) != (dmin is None):
            raise MiniTorchError("packed offsets need both m and dmin, or neither")
        lo, hi = (int(q.min()), int(q.max())) if q.size else (0, -1)
        fits4 = block % 8 == 0 and 0 <= lo and hi <= 15
        fits6 = block % 16 == 0 and -32 <= lo and hi <= 31
        if bits is None:
            bits = 4 if fits4 else 6 if fits6 else 8
        if bits == 4 and not fits4:
            raise MiniTorchError("4-bit packing needs codes in 0..15 and a block that is a multiple of 8")
        if bits == 6 and not fits6:
            raise MiniTorchError("6-bit packing needs codes in -32..31 and a block that is a multiple of 16")
        if bits not in (4, 6, 8):
            raise MiniTorchError(f"packed bits must be 4, 6 or 8, got {bits}")
        codes = q if bits == 8 else _nibble_words(q) if bits == 4 else _six_words(q)
        empty_i8 = np.zeros((n, 0), np.int8)
        empty_f32 = np.zeros((n, 0), np.float32)
        for label, arr, dt, cols in (("sc", sc, np.int8, k // block), ("d", d, np.float32, k // (block * per)),
                                     ("m", m, np.int8, k // block), ("dmin", dmin, np.float32, k // (block * per))):
            if arr is not None and (arr.shape != (n, cols) or arr.dtype != dt):
                raise MiniTorchError(f"packed {label} must be {np.dtype(dt)} of shape {(n, cols)}, "
                                     f"got {arr.dtype} {arr.shape}")
        self._set(_tile(codes), _tile(sc), _tile(d), _tile(empty_i8 if m is None else m),
                  _tile(empty_f32 if dmin is None else dmin), block, per, bits, n)

    @classmethod
    def from_tiles(cls, qt: np.ndarray, sc: np.ndarray, d: np.ndarray, m: np.ndarray, dmin: np.ndarray,
                   block: int, per: int, bits: int, n: int) -> "PackedWeight":
        """From arrays already in the tiled layout (a cache on disk, a narrowed view); no copy."""
        pw = cls.__new__(cls)
        pw._set(qt, sc, d, m, dmin, block, per, bits, n)
        return pw

    def _set(self, qt: np.ndarray, sc: np.ndarray, d: np.ndarray, m: np.ndarray, dmin: np.ndarray,
             block: int, per: int, bits: int, n: int) -> None:
        block, per, bits = int(block), int(per), int(bits)
        code_dtype = {8: np.int8, 6: np.uint32, 4: np.uint32}.get(bits)
        if code_dtype is None or qt.ndim != 3 or qt.dtype != code_dtype or qt.shape[2] != TILE:
            raise MiniTorchError(f"packed tiles must be {np.dtype(code_dtype) if code_dtype else '?'} "
                                 f"(groups, K, {TILE}) for bits {bits}, got {qt.dtype} {qt.shape}")
        groups, kc, _ = qt.shape
        if bits == 6 and kc % 3:
            raise MiniTorchError(f"6-bit codes come 3 words to 16 inputs, got {kc} words")
        k = inputs(kc, bits)
        if block < 1 or per < 1 or k % (block * per) or (bits == 4 and block % 8) or (bits == 6 and block % 16):
            raise MiniTorchError(f"packed block {block} x {per} does not divide the {k} inputs")
        if not (groups - 1) * TILE < n <= groups * TILE:
            raise MiniTorchError(f"{groups} tiles of {TILE} rows cannot hold {n} rows")
        nb, ns = k // block, k // (block * per)
        has_off = m.shape[1:2] != (0,)
        for label, arr, dt, cols in (("sc", sc, np.int8, nb), ("d", d, np.float32, ns),
                                     ("m", m, np.int8, nb if has_off else 0),
                                     ("dmin", dmin, np.float32, ns if has_off else 0)):
            if arr.shape != (groups, cols, TILE) or arr.dtype != dt:
                raise MiniTorchError(f"packed {label} tiles must be {np.dtype(dt)} of shape {(groups, cols, TILE)}, "
                                     f"got {arr.dtype} {arr.shape}")
            if not arr.flags.c_contiguous:
                raise MiniTorchError(f"packed {label} must be C-contiguous")
        if not qt.flags.c_contiguous:
            raise MiniTorchError("packed codes must be C-contiguous")
        self.qt, self.sc, self.d, self.m, self.dmin = qt, sc, d, m, dmin
        self.block, self.per, self.bits = block, per, bits
        self.shape = (int(n), k)
        # the CPU kernel's activation mode for this weight: "float32", "int8" (minitorch/cpu/packed.py), or None
        # for the process's mode (fast_packed.set_activations); set per model by fast_packed.set_weight_activations
        self.activations: Optional[str] = None

    @property
    def has_offset(self) -> bool:
        return self.m.shape[1] > 0

    @property
    def tiles(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(qt, sc, d, m, dmin): the five tiled arrays, in the order from_tiles takes them."""
        return self.qt, self.sc, self.d, self.m, self.dmin

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.tiles)

    def requires_grad_(self, flag: bool = True) -> "PackedWeight":
        if flag:
            raise MiniTorchError("packed weights are inference-only and cannot require grad")
        return self

    def _gather(self, ids: np.ndarray) -> tuple[np.ndarray, ...]:
        """Row-major (q, sc, d, m, dmin) of weight rows ids (1-d); q unpacked to int8 (len, K)."""
        g, lane = ids // TILE, ids % TILE
        q = self.qt[g, :, lane]
        if self.bits == 4:
            q = _nibble_codes(q)
        elif self.bits == 6:
            q = _six_codes(q)
        return (q,) + tuple(a[g, :, lane] for a in (self.sc, self.d, self.m, self.dmin))

    def codes(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Row-major (q, scale, offset) of weight rows ids (1-d): (len, K) int8, (len, K / block) float32 x2,
        scale = d * sc and offset = dmin * m as float32 products (the values the kernel uses)."""
        q, sc, d, m, dmin = self._gather(np.asarray(ids, dtype=np.int64))
        scale = np.repeat(d, self.per, axis=1) * sc.astype(np.float32)
        if m.shape[1]:
            offset = np.repeat(dmin, self.per, axis=1) * m.astype(np.float32)
        else:
            offset = np.zeros_like(scale)
        return q, scale, offset

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """float32 rows ids (any int shape) -> ids.shape + (K,), same values as dequantize()[ids]."""
        ids = np.asarray(ids, dtype=np.int64)
        n, k = self.shape
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            raise MiniTorchError(f"embedding ids must be in [0, {n}), got min {ids.min()} max {ids.max()}")
        q, scale, offset = self.codes(ids.reshape(-1))
        w = scale[:, :, None] * q.reshape(len(q), -1, self.block).astype(np.float32) - offset[:, :, None]
        return w.reshape(ids.shape + (k,)).astype(np.float32, copy=False)

    def narrow(self, dim: int, start: int, length: int) -> "PackedWeight":
        """Rows start..start+length-1 (Tensor.narrow for dim 0); shares this weight's tiles when start is a
        multiple of TILE (the model head's case), else copies those rows."""
        if dim != 0:
            raise MiniTorchError(f"a packed weight narrows along its rows (dim 0) only, got dim {dim}")
        n = self.shape[0]
        if start < 0 or length < 1 or start + length > n:
            raise MiniTorchError(f"narrow({start}, {length}) is outside the {n} rows of a packed weight")
        if start % TILE:
            q, sc, d, m, dmin = self._gather(np.arange(start, start + length))
            off = (m, dmin) if self.has_offset else (None, None)
            part = PackedWeight.from_blocks(q, self.block, self.per, sc, d, *off, bits=self.bits)
        else:
            tiles = slice(start // TILE, -(-(start + length) // TILE))
            part = PackedWeight.from_tiles(*(a[tiles] for a in self.tiles), self.block, self.per, self.bits, length)
        part.activations = self.activations  # a view computes as its weight does (a draft head's rows of the LM head)
        return part

    def dequantize(self) -> np.ndarray:
        """The float32 (N, K) weight."""
        return self.rows(np.arange(self.shape[0]))

    @classmethod
    def quantize(cls, w: np.ndarray, block: int = 32) -> "PackedWeight":
        """Symmetric int8 per-block quantization of a float32 (N, K) array (Q8_0's recipe: scale = absmax/127,
        offset 0). For tests and for users with float weights; GGUF weights are packed as stored instead."""
        w = np.asarray(w, dtype=np.float32)
        if w.ndim != 2 or w.shape[1] % block:
            raise MiniTorchError(f"quantize needs a (N, K) array with K divisible by {block}, got {w.shape}")
        b = w.reshape(w.shape[0], -1, block)
        scale = (np.abs(b).max(axis=2) / np.float32(127.0)).astype(np.float32)
        safe = np.where(scale == 0, np.float32(1.0), scale)
        q = np.clip(np.rint(b / safe[:, :, None]), -127, 127).astype(np.int8)
        return cls(q.reshape(w.shape), scale, np.zeros_like(scale), block, bits=8)

    @classmethod
    def quantize4(cls, w: np.ndarray, block: int = 32, per: int = 8) -> "PackedWeight":
        """Asymmetric 4-bit quantization of a float32 (N, K) array in Q4_K's layout: codes 0..15 per block
        of `block` inputs, the block's scale and offset as int8 multiples of two float32 factors shared by
        `per` blocks (value = d * sc * code - dmin * m; about 0.59 bytes a weight at 32 x 8). Lossy: for a
        draft model, whose weights change only how many drafts are accepted, never the output (see
        load_model's requantize)."""
        w = np.asarray(w, dtype=np.float32)
        if w.ndim != 2 or w.shape[1] % (block * per) or block % 8:
            raise MiniTorchError(f"quantize4 needs a (N, K) array with K divisible by {block * per} "
                                 f"(block {block}, a multiple of 8), got {w.shape}")
        n, k = w.shape
        b = w.reshape(n, k // (block * per), per, block)
        lo, hi = b.min(axis=3), b.max(axis=3)
        step = (hi - lo) / np.float32(15.0)  # each block's ideal scale and offset (-lo) ...
        d = (step.max(axis=2) / np.float32(127.0)).astype(np.float32)  # ... as int8 multiples of d / dmin
        dmin = (np.abs(lo).max(axis=2) / np.float32(127.0)).astype(np.float32)
        safe_d, safe_m = np.where(d == 0, np.float32(1.0), d), np.where(dmin == 0, np.float32(1.0), dmin)
        sc = np.clip(np.rint(step / safe_d[:, :, None]), 1, 127).astype(np.int8)
        m = np.clip(np.rint(-lo / safe_m[:, :, None]), -127, 127).astype(np.int8)
        scale = d[:, :, None] * sc.astype(np.float32)  # what the kernel uses, rounded as it rounds
        offset = dmin[:, :, None] * m.astype(np.float32)
        q = np.rint((b + offset[..., None]) / np.where(scale == 0, np.float32(1.0), scale)[..., None])
        q = np.clip(q, 0, 15).astype(np.int8).reshape(n, k)
        return cls.from_blocks(q, block, per, sc.reshape(n, -1), d, m.reshape(n, -1), dmin, bits=4)

    def joins(self, other: "PackedWeight") -> bool:
        """Whether `other`'s rows can follow this weight's in one PackedWeight (concat): the same inputs and code
        form (bits, block, per, offsets or none) and this weight's rows filling whole tiles."""
        return (self.shape[1] == other.shape[1] and (self.bits, self.block, self.per, self.has_offset)
                == (other.bits, other.block, other.per, other.has_offset) and self.shape[0] % TILE == 0)

    @classmethod
    def concat(cls, weights: "list[PackedWeight]") -> "PackedWeight":
        """The rows of `weights`, one weight after the other, as one PackedWeight (their tiles copied into one set
        of arrays). Each weight must join the next (joins: every one but the last fills whole tiles), so weight
        i's rows start at a multiple of TILE and narrow(0, start, n) of the result is a view equal to weight i.
        A product with the result computes every output row as the product with weight i does (the kernel's
        chain of a row does not depend on its neighbours), so it equals the separate products bit for bit."""
        if not weights or not all(a.joins(b) for a, b in zip(weights, weights[1:])):
            raise MiniTorchError("concat needs weights of one code form and inputs, all but the last in whole tiles")
        tiles = [np.concatenate([w.tiles[i] for w in weights]) for i in range(5)]
        fused = cls.from_tiles(*tiles, weights[0].block, weights[0].per, weights[0].bits,
                               sum(w.shape[0] for w in weights))
        fused.activations = weights[0].activations
        return fused

    def recoded(self, bits: int) -> "PackedWeight":
        """The same weight with its codes in another form (bits 4, 6 or 8, where the codes fit it): the same
        values, scales and products, other bytes (tests and A/Bs compare the forms)."""
        if bits == self.bits:
            return self
        q, sc, d, m, dmin = self._gather(np.arange(self.shape[0]))
        off = (m, dmin) if self.has_offset else (None, None)
        pw = PackedWeight.from_blocks(q, self.block, self.per, sc, d, *off, bits=bits)
        pw.activations = self.activations
        return pw

    def requantized4(self) -> "PackedWeight":
        """This weight with 4-bit codes (quantize4 of its values in blocks of 32, as many blocks sharing the
        float32 factors as K allows, up to 8); itself if its codes are 4-bit already."""
        if self.bits == 4:
            return self
        if self.shape[1] % 32:
            raise MiniTorchError(f"4-bit requantization needs rows of a multiple of 32 inputs, got {self.shape}")
        per = next(p for p in (8, 4, 2, 1) if self.shape[1] % (32 * p) == 0)
        return PackedWeight.quantize4(self.dequantize(), 32, per)

    def __repr__(self) -> str:
        return (f"PackedWeight(shape={self.shape}, block={self.block}x{self.per}, {self.bits}-bit codes, "
                f"{self.nbytes / 2**20:.1f} MiB)")


def _nibble_words(q: np.ndarray) -> np.ndarray:
    """(N, K) codes 0..15 -> (N, K / 8) uint32: byte t of word j = q[8j + t] | q[8j + 4 + t] << 4."""
    n, k = q.shape
    b = q.astype(np.uint8).reshape(n, k // 8, 2, 4)
    return np.ascontiguousarray(b[:, :, 0] | (b[:, :, 1] << 4)).view(np.uint32).reshape(n, k // 8)


def _nibble_codes(words: np.ndarray) -> np.ndarray:
    """Inverse of _nibble_words: (N, K / 8) uint32 -> (N, K) int8."""
    b = np.ascontiguousarray(words).view(np.uint8).reshape(words.shape[0], -1, 1, 4)
    return np.concatenate([b & 15, b >> 4], axis=2).reshape(words.shape[0], -1).astype(np.int8)


def _six_words(q: np.ndarray) -> np.ndarray:
    """(N, K) codes -32..31 -> (N, 3 K / 16) uint32: per 16 inputs two nibble words of the low 4 bits of
    u = q + 32 (as _nibble_words) and one word of their high 2 bits, byte t = sum_c (u[4c + t] >> 4) << 2c."""
    n, k = q.shape
    u = (q.astype(np.int16) + 32).astype(np.uint8).reshape(n, k // 16, 16)
    low = _nibble_words((u & 15).astype(np.int8).reshape(n, k)).reshape(n, k // 16, 2)
    hi = (u >> 4).reshape(n, k // 16, 4, 4)  # [., s, c, t] = high bits of input 4c + t of group s
    high = (hi[:, :, 0] | hi[:, :, 1] << 2 | hi[:, :, 2] << 4 | hi[:, :, 3] << 6).astype(np.uint8)
    high = np.ascontiguousarray(high).view(np.uint32)  # (n, k / 16, 1)
    return np.ascontiguousarray(np.concatenate([low, high], axis=2).reshape(n, 3 * k // 16))


def _six_codes(words: np.ndarray) -> np.ndarray:
    """Inverse of _six_words: (N, 3 K / 16) uint32 -> (N, K) int8."""
    n = words.shape[0]
    w = np.ascontiguousarray(words).reshape(n, -1, 3)
    low = _nibble_codes(np.ascontiguousarray(w[:, :, :2]).reshape(n, -1)).reshape(n, -1, 16)
    hb = np.ascontiguousarray(w[:, :, 2]).view(np.uint8).reshape(n, -1, 1, 4)  # [., s, 0, t]
    hi = (hb >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3  # [., s, c, t]
    u = low.astype(np.int16) + (hi.reshape(n, -1, 16).astype(np.int16) << 4)
    return (u - 32).astype(np.int8).reshape(n, -1)


def inputs(words: int, bits: int) -> int:
    """Inputs K held by `words` code entries per row of a tile (bits 4: 8 a word; 6: 16 per 3 words; 8: 1 each)."""
    return words * 8 if bits == 4 else words // 3 * 16 if bits == 6 else words


def _tile(a: np.ndarray) -> np.ndarray:
    """Row-major (N, C) -> tiled (ceil(N / TILE), C, TILE), rows past N zero."""
    n, c = a.shape
    groups = -(-n // TILE)
    padded = np.zeros((groups * TILE, c), dtype=a.dtype)
    padded[:n] = a
    return np.ascontiguousarray(padded.reshape(groups, TILE, c).transpose(0, 2, 1))


def packed_linear_reference(x: np.ndarray, w: PackedWeight, out: np.ndarray) -> None:
    """out (R, N) = x (R, K) @ w^T through the dequantized float32 weight (SimpleOps' slot)."""
    np.matmul(x, w.dequantize().T, out=out)
