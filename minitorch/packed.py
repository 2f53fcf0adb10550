"""Packed (block-quantized) weights: a (N, K) matrix kept in the form a GGUF file stores it.

    w[n, k] = scale[n, k // block] * q[n, k] - offset[n, k // block]        (float32, two roundings)

q holds int8 codes, scale and offset one float32 each per block of `block` consecutive inputs. Every
GGUF type we read (Q4_0/1, Q5_0/1, Q8_0, Q4_K, Q5_K, Q6_K) fits this form, and because the product and
the difference are rounded separately, exactly as the gguf library's dequantizers compute them, the
float32 weights rebuilt here are bit for bit the weights of the float32 model (tests check it).

A packed model reads 1 + 8/block bytes per weight instead of float32's 4 and holds a third of the memory.
The weights are the model's own, not a new quantization: outputs differ from the float32 path only by
summation order. Stored in tiles of TILE interleaved rows (below), minitorch/cpu/packed.py's kernel converts and
multiplies 8 adjacent outputs per AVX2 instruction with no horizontal sums, which makes packed the
faster form on the CPU (it reads a third of the bytes and is no longer compute-bound): 1.5B
target decode 5.32 vs 3.47 tokens/s float32, same greedy tokens (`python project/bench/cpu_decode.py
--tokens 48 --repeats 2`, 2-core box, 2026-11-30 11:25 UTC). `load_model(weights="auto")`, the default,
picks it for GGUF files on backends with a packed kernel.

Inference only: a packed weight has no gradient. `nn.linear` and `nn.embedding` accept one in place of
a weight tensor; backends run it through their `packed_linear` slot (FastOps: minitorch/cpu/packed.py's numba
kernel; SimpleOps: dequantize, then numpy matmul, the reference).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .tensor_data import MiniTorchError


TILE = 128  # weight rows interleaved per tile (the kernel's vector lanes); N is padded up to a multiple


class PackedWeight:
    """A (N, K) float32 weight stored as int8 codes plus per-block scale and offset (see module doc).

    Storage is tiled: TILE consecutive weight rows are interleaved, so that for every input k the codes
    of those rows lie next to each other and a vector instruction serves several adjacent outputs.
        qt[g, k, i]     = q[g * TILE + i, k]                    (N_pad / TILE, K, TILE) int8
        st[g, b, i]     = scale[g * TILE + i, b]                (N_pad / TILE, K / block, TILE) float32
        ot[g, b, i]     = offset[g * TILE + i, b]               (same)
    Rows past N (padding of the last tile) hold zeros.
    """

    dims = 2
    dtype = "packed"
    requires_grad = False

    def __init__(self, q: np.ndarray, scale: np.ndarray, offset: np.ndarray, block: int) -> None:
        """From row-major codes q (N, K) and scale / offset (N, K / block), as a GGUF file stores them."""
        if q.ndim != 2 or q.dtype != np.int8:
            raise MiniTorchError(f"packed codes must be a 2-d int8 array, got {q.dtype} of shape {q.shape}")
        n, k = q.shape
        if block < 1 or k % block:
            raise MiniTorchError(f"packed block {block} does not divide the {k} inputs")
        want = (n, k // block)
        for label, arr in (("scale", scale), ("offset", offset)):
            if arr.shape != want or arr.dtype != np.float32:
                raise MiniTorchError(f"packed {label} must be float32 of shape {want}, got {arr.dtype} {arr.shape}")
        self._set(_tile(q), _tile(scale), _tile(offset), block, n)

    @classmethod
    def from_tiles(cls, qt: np.ndarray, st: np.ndarray, ot: np.ndarray, block: int, n: int) -> "PackedWeight":
        """From arrays already in the tiled layout (a cache on disk, a narrowed view); no copy."""
        pw = cls.__new__(cls)
        pw._set(qt, st, ot, block, n)
        return pw

    def _set(self, qt: np.ndarray, st: np.ndarray, ot: np.ndarray, block: int, n: int) -> None:
        if qt.ndim != 3 or qt.dtype != np.int8 or qt.shape[2] != TILE:
            raise MiniTorchError(f"packed tiles must be int8 (groups, K, {TILE}), got {qt.dtype} {qt.shape}")
        groups, k, _ = qt.shape
        block = int(block)
        if block < 1 or k % block:
            raise MiniTorchError(f"packed block {block} does not divide the {k} inputs")
        if not (groups - 1) * TILE < n <= groups * TILE:
            raise MiniTorchError(f"{groups} tiles of {TILE} rows cannot hold {n} rows")
        for label, arr in (("scale", st), ("offset", ot)):
            if arr.shape != (groups, k // block, TILE) or arr.dtype != np.float32:
                raise MiniTorchError(f"packed {label} tiles must be float32 of shape {(groups, k // block, TILE)}, "
                                     f"got {arr.dtype} {arr.shape}")
        for label, arr in (("codes", qt), ("scale", st), ("offset", ot)):
            if not arr.flags.c_contiguous:
                raise MiniTorchError(f"packed {label} must be C-contiguous")
        self.qt, self.st, self.ot, self.block = qt, st, ot, block
        self.shape = (int(n), k)

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def nbytes(self) -> int:
        return self.qt.nbytes + self.st.nbytes + self.ot.nbytes

    def requires_grad_(self, flag: bool = True) -> "PackedWeight":
        if flag:
            raise MiniTorchError("packed weights are inference-only and cannot require grad")
        return self

    def codes(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Row-major (q, scale, offset) of weight rows ids (1-d): (len, K) int8, (len, K / block) float32 x2."""
        g, lane = ids // TILE, ids % TILE
        return self.qt[g, :, lane], self.st[g, :, lane], self.ot[g, :, lane]

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
            return PackedWeight(*self.codes(np.arange(start, start + length)), block=self.block)
        tiles = slice(start // TILE, -(-(start + length) // TILE))
        return PackedWeight.from_tiles(self.qt[tiles], self.st[tiles], self.ot[tiles], self.block, length)

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
        return cls(q.reshape(w.shape), scale, np.zeros_like(scale), block)

    def __repr__(self) -> str:
        return f"PackedWeight(shape={self.shape}, block={self.block}, {self.nbytes / 2**20:.1f} MiB)"


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


def packed_linear(x: Any, weight: PackedWeight, bias: Any = None) -> Any:
    """x (..., K) @ weight^T + bias for a packed weight; the backend's `packed_linear` slot does the product."""
    from .autodiff import is_grad_enabled
    from .tensor import Tensor
    from .tensor_creation import from_numpy

    n, k = weight.shape
    if not isinstance(x, Tensor) or x.dims == 0 or x.shape[-1] != k:
        raise MiniTorchError(f"linear: input {getattr(x, 'shape', x)} does not match weight (out, in) = {weight.shape}")
    if x.dtype != "float32":
        raise MiniTorchError(f"linear with a packed weight needs float32 input, got {x.dtype}")
    if is_grad_enabled() and x.requires_grad:
        raise MiniTorchError("packed weights are inference-only: run under minitorch.no_grad() or load float32 weights")
    slot = getattr(x.backend, "packed_linear", None)
    if slot is None:
        raise MiniTorchError(f"{x.backend.name} cannot run packed weights; load the model with weights='float32'")
    xn = np.ascontiguousarray(x.to_numpy(), dtype=np.float32).reshape(-1, k)
    out = np.empty((xn.shape[0], n), dtype=np.float32)
    slot(xn, weight, out)
    y = from_numpy(out.reshape(tuple(x.shape[:-1]) + (n,)), backend=x.backend)
    if bias is not None:
        if bias.shape != (n,):
            raise MiniTorchError(f"linear bias shape {bias.shape} != ({n},)")
        y = y + bias
    return y


def packed_embedding(weight: PackedWeight, ids: Any) -> Any:
    """Rows of a packed (V, D) weight for int64 ids -> ids.shape + (D,) float32 tensor."""
    from .tensor_creation import from_numpy

    if ids.dtype != "int64":
        raise MiniTorchError(f"embedding ids must be int64, got {ids.dtype} of shape {ids.shape}")
    return from_numpy(weight.rows(ids.to_numpy()), backend=ids.backend)
