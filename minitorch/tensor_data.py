"""TensorData: a 1-D storage array plus shape and strides (in elements), and the index math.

A view never copies: it is a new TensorData over the same storage. Slicing with an offset
re-bases the storage (storage[offset:] is itself a view), so no offset field is needed and
kernels only ever see (storage, shape, strides).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterable, List, Sequence, Tuple

import numpy as np

Shape = Tuple[int, ...]
Strides = Tuple[int, ...]

DTYPES = {"float32": np.float32, "int64": np.int64}


class MiniTorchError(ValueError):
    """A user mistake: bad shapes, dims or dtypes. The message names what was wrong."""


def strides_from_shape(shape: Sequence[int]) -> Strides:
    """Row-major (contiguous) strides in elements."""
    out: List[int] = []
    acc = 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


contiguous_strides = lru_cache(maxsize=8192)(strides_from_shape)
contiguous_strides.__doc__ = "Cached strides_from_shape for the hot path (shape must be a tuple)."


def prod(shape: Iterable[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def shape_broadcast(a: Shape, b: Shape) -> Shape:
    """Broadcast two shapes numpy-style; MiniTorchError naming both if they cannot."""
    if a == b:
        return a
    n = max(len(a), len(b))
    pa = (1,) * (n - len(a)) + tuple(a)
    pb = (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(pa, pb):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise MiniTorchError(f"cannot broadcast shapes {tuple(a)} and {tuple(b)}")
    return tuple(out)


def broadcast_strides(shape: Shape, strides: Strides, out_shape: Shape) -> Strides:
    """Strides that read a tensor of `shape` as if expanded to `out_shape` (0 on broadcast dims)."""
    n = len(out_shape)
    k = n - len(shape)
    if k < 0:
        raise MiniTorchError(f"cannot broadcast shape {tuple(shape)} to {tuple(out_shape)}")
    res = [0] * n
    for i in range(len(shape)):
        s = shape[i]
        o = out_shape[k + i]
        if s == o:
            res[k + i] = strides[i] if s != 1 else 0
        elif s == 1:
            res[k + i] = 0
        else:
            raise MiniTorchError(f"cannot broadcast shape {tuple(shape)} to {tuple(out_shape)}")
    return tuple(res)


def norm_dim(dim: int, dims: int, shape: Shape = ()) -> int:
    """Normalize a possibly negative dim; MiniTorchError if out of range."""
    d = dim + dims if dim < 0 else dim
    if not 0 <= d < max(dims, 1) or (dims == 0 and d != 0):
        raise MiniTorchError(f"dim {dim} out of range for tensor of shape {tuple(shape)} ({dims} dims)")
    return d


def to_index(ordinal: int, shape: Shape) -> List[int]:
    """Multi-index of the ordinal-th element in row-major order."""
    idx = [0] * len(shape)
    for i in range(len(shape) - 1, -1, -1):
        s = shape[i]
        idx[i] = ordinal % s
        ordinal //= s
    return idx


def index_to_position(index: Sequence[int], strides: Strides) -> int:
    """Storage position of a multi-index."""
    p = 0
    for i, s in zip(index, strides):
        p += i * s
    return p


Spec = Tuple[tuple, ...]


def apply_spec(shape: Tuple[int, ...], strides: Tuple[int, ...], spec: Spec) -> Tuple[int, tuple, tuple]:
    """Apply a normalized slicing spec to (shape, strides) -> (storage offset, new shape, new strides).

    spec entries: ("i", k) picks index k and drops the dim; ("s", start, step, length) slices it;
    ("n",) inserts a new size-1 dim (consumes no input dim)."""
    offset = 0
    out_shape: List[int] = []
    out_strides: List[int] = []
    d = 0
    for e in spec:
        if e[0] == "n":
            out_shape.append(1)
            out_strides.append(0)
            continue
        st = strides[d]
        if e[0] == "i":
            offset += e[1] * st
        else:
            offset += e[1] * st if e[3] > 0 else 0
            out_shape.append(e[3])
            out_strides.append(st * e[2])
        d += 1
    for k in range(d, len(shape)):
        out_shape.append(shape[k])
        out_strides.append(strides[k])
    return offset, tuple(out_shape), tuple(out_strides)


class TensorData:
    """Storage (1-D array: numpy on CPU, cupy on CUDA) viewed with a shape and element strides."""

    __slots__ = ("storage", "shape", "strides", "size", "dims", "dtype", "_contig", "_arrs")

    def __init__(self, storage: Any, shape: Sequence[int], strides: Sequence[int] | None = None,
                 dtype: str | None = None) -> None:
        self.shape = tuple(int(s) for s in shape)
        if strides is None:
            strides = strides_from_shape(self.shape)
        self.strides = tuple(int(s) for s in strides)
        if len(self.strides) != len(self.shape):
            raise MiniTorchError(f"strides {self.strides} do not match shape {self.shape}")
        self.storage = storage
        self.size = prod(self.shape)
        self.dims = len(self.shape)
        self.dtype = dtype if dtype is not None else str(storage.dtype)
        self._contig: bool | None = None
        self._arrs: Any = None
        if self.size > 0:
            last = sum((s - 1) * st for s, st in zip(self.shape, self.strides))
            if last >= storage.shape[0] or any(st < 0 for st in self.strides):
                raise MiniTorchError(
                    f"shape {self.shape} / strides {self.strides} reach past storage of {storage.shape[0]}")

    @classmethod
    def make(cls, storage: Any, shape: Shape, strides: Strides, dtype: str,
             contig: bool | None = None) -> "TensorData":
        """Unchecked constructor for the hot path (shape/strides already valid tuples of int)."""
        td = cls.__new__(cls)
        td.storage = storage
        td.shape = shape
        td.strides = strides
        n = 1
        for s in shape:
            n *= s
        td.size = n
        td.dims = len(shape)
        td.dtype = dtype
        td._contig = contig
        td._arrs = None
        return td

    def is_contiguous(self) -> bool:
        """Row-major contiguous (size-1 dims may have any stride)."""
        c = self._contig
        if c is None:
            acc = 1
            c = True
            for s, st in zip(reversed(self.shape), reversed(self.strides)):
                if s != 1 and st != acc:
                    c = False
                    break
                acc *= s
            self._contig = c
        return c

    def np_meta(self) -> Tuple[np.ndarray, np.ndarray]:
        """(shape, strides) as int64 arrays for kernels, cached."""
        a = self._arrs
        if a is None:
            a = self._arrs = (np.array(self.shape, dtype=np.int64), np.array(self.strides, dtype=np.int64))
        return a

    def permute(self, order: Sequence[int]) -> "TensorData":
        if sorted(order) != list(range(self.dims)):
            raise MiniTorchError(f"permute order {tuple(order)} is not a permutation of {self.dims} dims "
                                 f"(shape {self.shape})")
        return TensorData.make(self.storage, tuple(self.shape[i] for i in order),
                               tuple(self.strides[i] for i in order), self.dtype)

    def index(self, index: Sequence[int]) -> int:
        """Storage position of a full multi-index, with bounds checks."""
        if len(index) != self.dims:
            raise MiniTorchError(f"index {tuple(index)} has {len(index)} dims, tensor has shape {self.shape}")
        for i, s in zip(index, self.shape):
            if not 0 <= i < s:
                raise MiniTorchError(f"index {tuple(index)} out of range for shape {self.shape}")
        return index_to_position(index, self.strides)

    def to_string(self) -> str:
        return f"TensorData(shape={self.shape}, strides={self.strides}, dtype={self.dtype})"
