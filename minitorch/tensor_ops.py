"""Backends: TensorOps (interface + reference compositions of the fused ops), SimpleOps (pure-Python
loops, the test oracle) and TensorBackend, the slot table a tensor carries (STYLE item 1).

Every slot takes and returns Tensors; map/zip/matmul slots also take `out=`. Fused slots (softmax,
rmsnorm, attention, ...) have a reference composition here that FastOps/CudaOps override.
Backends (minitorch/cpu, minitorch/cuda) build on this module and never import the core's Tensor side:
they make results with new_tensor / make_tensor / from_array, whose Tensor class minitorch/__init__.py
installs (docs/ARCHITECTURE.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from . import operators
from .autodiff import no_grad
from .tensor_data import (DTYPES, MiniTorchError, TensorData, broadcast_strides, contiguous_strides,
                          index_to_position, shape_broadcast, strides_from_shape, to_index)
from .packed import packed_linear_reference

if TYPE_CHECKING:  # annotations only: backends sit below the core and never import its Tensor class
    from .tensor import Tensor

# The core's Tensor class, handed down by minitorch/__init__.py (install_tensor_class) once the core is
# imported: backends build their results with it without importing minitorch.tensor (no import cycle).
_tensor_class: Any = None


def install_tensor_class(cls: Any) -> None:
    """Set the class that make_tensor / new_tensor build (minitorch.Tensor; called once by minitorch/__init__)."""
    global _tensor_class
    _tensor_class = cls


def make_tensor(td: TensorData, backend: "TensorBackend") -> Tensor:
    """A Tensor over td on backend (the class install_tensor_class was given)."""
    if _tensor_class is None:
        raise MiniTorchError("no Tensor class installed: import minitorch (its __init__ installs minitorch.Tensor)")
    return _tensor_class(td, backend)


def new_tensor(backend: "TensorBackend", shape: Tuple[int, ...], dtype: str) -> Tensor:
    """A fresh contiguous tensor (uninitialized storage) on backend."""
    n = 1
    for s in shape:
        n *= s
    # the installed class called directly: this runs once per op (make_tensor's check is for other callers)
    return _tensor_class(TensorData.make(backend.empty(n, dtype), shape, contiguous_strides(shape), dtype, True),
                         backend)


def from_array(arr: np.ndarray, backend: "TensorBackend", dtype: Optional[str] = None) -> Tensor:
    """Wrap a numpy array on backend. float32/int64 CPU arrays with non-negative strides share memory (no
    copy); other dtypes are converted (float -> float32, int/bool -> int64 unless dtype says otherwise).
    minitorch.from_numpy is this with the default backend."""
    arr = np.asarray(arr)
    if dtype is None:
        dtype = "int64" if arr.dtype.kind in "iub" else "float32"
    if not backend.cuda and dtype not in DTYPES:
        raise MiniTorchError(f"dtype {dtype!r} not supported on CPU; use one of {sorted(DTYPES)}")
    np_dtype = DTYPES.get(dtype, np.float32)
    if arr.dtype != np_dtype:
        arr = arr.astype(np_dtype)
    if not backend.cuda:
        itemsize = arr.itemsize
        ok = all(s >= 0 and s % itemsize == 0 for s in arr.strides)
        if not ok:
            arr = np.ascontiguousarray(arr)
        strides = tuple(s // itemsize for s in arr.strides)
        if arr.size == 0:
            storage = np.empty(0, dtype=np_dtype)
            strides = strides_from_shape(arr.shape)
        else:
            span = 1 + sum((n - 1) * s for n, s in zip(arr.shape, strides))
            storage = np.lib.stride_tricks.as_strided(arr, shape=(span,), strides=(itemsize,))
        return make_tensor(TensorData(storage, arr.shape, strides, dtype), backend)
    arr = np.ascontiguousarray(arr)
    if dtype == "bfloat16":  # bf16 is stored as raw bits: upload float32, convert on the device
        t = make_tensor(TensorData(backend.asarray(arr.reshape(-1)), arr.shape, None, "float32"), backend)
        return t.to("bfloat16")
    return make_tensor(TensorData(backend.asarray(arr.reshape(-1)), arr.shape, None, dtype), backend)


def argmax_out(a: Tensor, dim: int) -> Tensor:
    """The keepdim int64 result of argmax over dim (refusing an empty dim), for every backend's argmax."""
    shape = list(a.shape)
    if shape[dim] == 0:
        raise MiniTorchError(f"argmax over an empty dim {dim} of shape {a.shape}")
    shape[dim] = 1
    return new_tensor(a.backend, tuple(shape), "int64")


def check_writable(out: Tensor) -> None:
    """MiniTorchError (not a numba typing crash) when writing into read-only storage (e.g. an mmap)."""
    flags = getattr(out._tensor.storage, "flags", None)
    if flags is not None and not getattr(flags, "writeable", True):
        raise MiniTorchError(f"cannot write into a read-only tensor of shape {out.shape} "
                             "(from_numpy of a read-only array); copy it first")


def map_out(name: str, a: Tensor, out: Optional[Tensor]) -> Tensor:
    """Output tensor for a map: a's shape (or the given out, which a must broadcast to)."""
    if out is None:
        dt = a._tensor.dtype
        if dt != "float32" and name not in operators.INT_CLOSED:
            dt = "float32"
        return new_tensor(a.backend, a._tensor.shape, dt)
    if out.backend is not a.backend:
        raise MiniTorchError(f"out is on backend {out.backend.name}, input on {a.backend.name}")
    check_writable(out)
    broadcast_strides(a.shape, a.strides, out.shape)  # raises naming the shapes
    return out


def zip_prepare(name: str, a: Tensor, b: Tensor, out: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """Check backends, unify dtypes (int64 next to float32 -> float32) and make the output."""
    if a.backend is not b.backend:
        raise MiniTorchError(f"tensors on different backends: {a.backend.name} and {b.backend.name}")
    da, db = a._tensor.dtype, b._tensor.dtype
    if da != db or (da == "int64" and name not in operators.INT_CLOSED and name not in operators.COMPARISONS):
        if da != "float32":
            a = a.backend.cast(a, "float32")
        if db != "float32":
            b = b.backend.cast(b, "float32")
        da = "float32"
    sa, sb = a._tensor.shape, b._tensor.shape
    shape = sa if sa == sb else shape_broadcast(sa, sb)
    if out is None:
        out = new_tensor(a.backend, shape, "float32" if name in operators.COMPARISONS else da)
    else:
        if shape_broadcast(shape, out.shape) != out.shape:
            raise MiniTorchError(f"result of shapes {sa} and {sb} does not fit out of shape {out.shape}")
        check_writable(out)
    return a, b, out


def where_prepare(c: Tensor, a: Tensor, b: Tensor, out: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """Unify a/b dtypes and make the output of the broadcast of c, a and b."""
    if c.backend is not a.backend:
        raise MiniTorchError(f"tensors on different backends: {c.backend.name} and {a.backend.name}")
    shape = shape_broadcast(c.shape, shape_broadcast(a.shape, b.shape))
    if out is not None:
        if shape_broadcast(shape, out.shape) != out.shape:
            raise MiniTorchError(f"where of shapes {c.shape}, {a.shape}, {b.shape} does not fit out "
                                 f"of shape {out.shape}")
        check_writable(out)
    if out is None:
        dt = a.dtype if a.dtype == b.dtype else "float32"
        out = new_tensor(a.backend, shape, dt)
    return a, b, out


def check_dims(a: Tensor, dims: Sequence[int], what: str) -> None:
    if a.dims not in dims:
        raise MiniTorchError(f"{what}: expected {' or '.join(map(str, dims))} dims, got shape {a.shape}")


def matmul_shape(a: Tensor, b: Tensor) -> Tuple[int, ...]:
    """Result shape of a batched matmul, with clear errors."""
    if a.dims < 2 or b.dims < 2:
        raise MiniTorchError(f"matmul needs >= 2-d operands, got shapes {a.shape} and {b.shape}")
    if a.shape[-1] != b.shape[-2]:
        raise MiniTorchError(f"matmul shape mismatch: {a.shape} @ {b.shape} "
                             f"(inner dims {a.shape[-1]} != {b.shape[-2]})")
    if a.dtype != b.dtype:
        raise MiniTorchError(f"matmul dtype mismatch: {a.dtype} @ {b.dtype}")
    try:
        batch = shape_broadcast(a.shape[:-2], b.shape[:-2])
    except MiniTorchError:
        raise MiniTorchError(f"matmul batch dims do not broadcast: {a.shape} @ {b.shape}") from None
    return batch + (a.shape[-2], b.shape[-1])


def causal_mask(n_rows_per_group: int, groups: int, q_start: int, length: int) -> np.ndarray:
    """(groups*T, L) float32, 1 where key j is NOT visible to query t (j > q_start + t)."""
    t = np.arange(n_rows_per_group)[:, None]
    j = np.arange(length)[None, :]
    m = (j > q_start + t).astype(np.float32)
    return np.tile(m, (groups, 1))


class TensorOps:
    """Interface of a backend. Allocation hooks are numpy here; CudaOps overrides them."""

    cuda = False

    @staticmethod
    def empty(n: int, dtype: str) -> Any:
        if dtype not in DTYPES:
            raise MiniTorchError(f"dtype {dtype!r} not supported on CPU; use one of {sorted(DTYPES)}")
        return np.empty(n, dtype=DTYPES[dtype])

    @staticmethod
    def asarray(arr: np.ndarray) -> Any:
        return arr

    @staticmethod
    def to_numpy(td: TensorData) -> np.ndarray:
        st = td.storage
        if td.size == 0:
            return np.empty(td.shape, dtype=st.dtype)
        isz = st.itemsize
        return np.ndarray(td.shape, st.dtype, st, 0, tuple(s * isz for s in td.strides))

    # generic slots: subclasses implement
    @staticmethod
    def map(name: str) -> Callable[..., Tensor]:
        raise NotImplementedError

    @staticmethod
    def zip(name: str) -> Callable[..., Tensor]:
        raise NotImplementedError

    @staticmethod
    def reduce(name: str, start: float) -> Callable[[Tensor, int], Tensor]:
        raise NotImplementedError

    @staticmethod
    def cast(a: Tensor, dtype: str) -> Tensor:
        out = new_tensor(a.backend, a.shape, dtype)
        return a.backend.id_map(a, out=out)

    @staticmethod
    def copy_(out: Tensor, src: Tensor) -> Tensor:
        return out.backend.id_map(src, out=out)

    # ---- reference compositions of the fused slots (run with no history) ----
    @staticmethod
    def softmax(x: Tensor, dim: int) -> Tensor:
        with no_grad():
            e = (x - x.max(dim, keepdim=True)).exp()
            return e / e.sum(dim, keepdim=True)

    @staticmethod
    def log_softmax(x: Tensor, dim: int) -> Tensor:
        with no_grad():
            s = x - x.max(dim, keepdim=True)
            return s - s.exp().sum(dim, keepdim=True).log()

    @staticmethod
    def rmsnorm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
        with no_grad():
            return x * ((x * x).mean(-1, keepdim=True) + eps).rsqrt() * weight

    @staticmethod
    def layernorm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
        with no_grad():
            xc = x - x.mean(-1, keepdim=True)
            return xc * ((xc * xc).mean(-1, keepdim=True) + eps).rsqrt() * weight + bias

    @staticmethod
    def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        with no_grad():
            d = x.shape[-1]
            h = d // 2
            rot = x.backend.cat([-x.narrow(-1, h, d - h), x.narrow(-1, 0, h)], x.dims - 1)
            return x * cos + rot * sin

    @staticmethod
    def embedding(weight: Tensor, ids: Tensor) -> Tensor:
        flat = np.asarray(ids.reshape(ids.size).to_numpy())
        bad = np.nonzero((flat < 0) | (flat >= weight.shape[0]))[0]
        if bad.size:
            raise MiniTorchError(f"embedding: id {int(flat[bad[0]])} out of range for {weight.shape[0]} rows "
                                 f"(ids shape {ids.shape})")
        out = new_tensor(weight.backend, (ids.size, weight.shape[1]), weight.dtype)
        with no_grad():
            for i, t in enumerate(flat.tolist()):
                out[i].copy_(weight[t])
        return out.view(*ids.shape, weight.shape[1])

    @staticmethod
    def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
        with no_grad():
            return gate.silu() * up

    @staticmethod
    def attention(q: Tensor, k: Tensor, v: Tensor, scale: float, q_start: int) -> Tensor:
        with no_grad():
            b, hq, t, d = q.shape
            hkv, length = k.shape[1], k.shape[2]
            g = hq // hkv
            qg = q.reshape(b, hkv, g * t, d)                      # (B, Hkv, G*T, D)
            s = (qg @ k.transpose(2, 3)) * scale                  # (B, Hkv, G*T, L)
            mask = from_array(causal_mask(t, g, q_start, length), q.backend)
            p = q.backend.softmax(s.masked_fill(mask, -math.inf), 3)
            return (p @ v).view(b, hq, t, d)                      # (B, Hq, T, D)

    @staticmethod
    def cat(tensors: Sequence[Tensor], dim: int) -> Tensor:
        t0 = tensors[0]
        shape = list(t0.shape)
        shape[dim] = sum(t.shape[dim] for t in tensors)
        out = new_tensor(t0.backend, tuple(shape), t0.dtype)
        off = 0
        with no_grad():
            for t in tensors:
                n = t.shape[dim]
                out.narrow(dim, off, n).copy_(t)
                off += n
        return out


class SimpleOps(TensorOps):
    """Pure-Python loops over the index math: slow, obviously correct, the reference for tests."""

    # packed weights: rebuild the float32 weight, then one numpy matmul (the reference for minitorch/cpu/packed.py)
    packed_linear = staticmethod(packed_linear_reference)

    @staticmethod
    def map(name: str) -> Callable[..., Tensor]:
        f = operators.UNARY[name]

        def _map(a: Tensor, out: Optional[Tensor] = None) -> Tensor:
            out = map_out(name, a, out)
            ot, at = out._tensor, a._tensor
            a_str = broadcast_strides(at.shape, at.strides, ot.shape)
            conv = int if ot.dtype == "int64" else float
            src = at.storage
            dst = ot.storage
            for i in range(ot.size):
                idx = to_index(i, ot.shape)
                dst[index_to_position(idx, ot.strides)] = conv(f(src[index_to_position(idx, a_str)].item()))
            return out

        return _map

    @staticmethod
    def zip(name: str) -> Callable[..., Tensor]:
        f = operators.BINARY[name]

        def _zip(a: Tensor, b: Tensor, out: Optional[Tensor] = None) -> Tensor:
            a, b, out = zip_prepare(name, a, b, out)
            ot, at, bt = out._tensor, a._tensor, b._tensor
            a_str = broadcast_strides(at.shape, at.strides, ot.shape)
            b_str = broadcast_strides(bt.shape, bt.strides, ot.shape)
            conv = int if ot.dtype == "int64" else float
            for i in range(ot.size):
                idx = to_index(i, ot.shape)
                x = at.storage[index_to_position(idx, a_str)].item()
                y = bt.storage[index_to_position(idx, b_str)].item()
                ot.storage[index_to_position(idx, ot.strides)] = conv(f(x, y))
            return out

        return _zip

    @staticmethod
    def where(c: Tensor, a: Tensor, b: Tensor, out: Optional[Tensor] = None) -> Tensor:
        a, b, out = where_prepare(c, a, b, out)
        ot = out._tensor
        strs = [broadcast_strides(t.shape, t.strides, ot.shape) for t in (c._tensor, a._tensor, b._tensor)]
        for i in range(ot.size):
            idx = to_index(i, ot.shape)
            cond = c._tensor.storage[index_to_position(idx, strs[0])] != 0
            src = a._tensor if cond else b._tensor
            ot.storage[index_to_position(idx, ot.strides)] = src.storage[index_to_position(idx, strs[1 if cond else 2])]
        return out

    @staticmethod
    def reduce(name: str, start: float) -> Callable[[Tensor, int], Tensor]:
        f = operators.BINARY[name]

        def _reduce(a: Tensor, dim: int) -> Tensor:
            at = a._tensor
            shape = list(at.shape)
            n = shape[dim]
            shape[dim] = 1
            dt = at.dtype if name != "max" or at.dtype == "int64" else "float32"
            out = new_tensor(a.backend, tuple(shape), dt)
            ot = out._tensor
            for i in range(ot.size):
                idx = to_index(i, ot.shape)
                acc = start
                for j in range(n):
                    idx[dim] = j
                    acc = f(acc, at.storage[index_to_position(idx, at.strides)].item())
                idx[dim] = 0
                ot.storage[index_to_position(idx, ot.strides)] = acc
            return out

        return _reduce

    @staticmethod
    def argmax(a: Tensor, dim: int) -> Tensor:
        at, n = a._tensor, a.shape[dim]
        out = argmax_out(a, dim)
        ot = out._tensor
        for i in range(ot.size):
            idx = to_index(i, ot.shape)
            best, bi = -math.inf, 0
            for j in range(n):
                idx[dim] = j
                x = at.storage[index_to_position(idx, at.strides)].item()
                if x > best or (x != x and best == best):
                    best, bi = x, j
                    if x != x:
                        break
            ot.storage[i] = bi
        return out

    @staticmethod
    def matrix_multiply(a: Tensor, b: Tensor, out: Optional[Tensor] = None) -> Tensor:
        shape = matmul_shape(a, b)
        if out is None:
            out = new_tensor(a.backend, shape, a.dtype)
        elif out.shape != shape:
            raise MiniTorchError(f"matmul result shape {shape} does not match out of shape {out.shape}")
        else:
            check_writable(out)
        at, bt, ot = a._tensor, b._tensor, out._tensor
        batch = shape[:-2]
        a_str = broadcast_strides(at.shape[:-2], at.strides[:-2], batch)
        b_str = broadcast_strides(bt.shape[:-2], bt.strides[:-2], batch)
        n, k, m = shape[-2], a.shape[-1], shape[-1]
        nb = 1
        for s in batch:
            nb *= s
        conv = int if ot.dtype == "int64" else float
        for bi in range(nb):
            idx = to_index(bi, batch)
            pa, pb = index_to_position(idx, a_str), index_to_position(idx, b_str)
            po = index_to_position(idx, ot.strides[:-2])
            for i in range(n):
                for j in range(m):
                    acc = 0.0
                    for r in range(k):
                        acc += (at.storage[pa + i * at.strides[-2] + r * at.strides[-1]].item()
                                * bt.storage[pb + r * bt.strides[-2] + j * bt.strides[-1]].item())
                    ot.storage[po + i * ot.strides[-2] + j * ot.strides[-1]] = conv(acc)
        return out


class LayerWeights(NamedTuple):
    """One pre-norm decoder layer's weights (Tensors or PackedWeights; biases may be None), in the order the
    `decoder_forward` slot reads them: the model fills it, the backend runs it."""
    input_norm: Any
    q: Any
    q_bias: Any
    k: Any
    k_bias: Any
    v: Any
    v_bias: Any
    o: Any
    post_norm: Any
    gate: Any
    up: Any
    down: Any
    # (PackedWeight, n): the first n of (q, k, v) joined into one weight (PackedWeight.concat), for one product
    # instead of n; None: each separately. gate_up: the same for (gate, up).
    qkv: Any = None
    gate_up: Any = None


@dataclass(frozen=True)
class DecoderStack:
    """A whole pre-norm decoder as the `decoder_forward` slot runs it: the model builds it once (and anew when a
    weight or its rotary tables change), the backend runs it; each call adds only ids, cache, last_n, return_hidden
    and x0. embed None: every call passes x0 (a draft head's fc output); norm None: no final norm."""
    embed: Any  # (V, D) Tensor or PackedWeight, or None
    layers: Tuple[LayerWeights, ...]
    norm: Any  # (D,) final norm weight, or None
    head: Any  # (rows, D) the vocabulary projection (PackedWeight)
    eps: float
    n_heads: int
    n_kv_heads: int
    head_dim: int
    cos_table: Any  # (max_pos, head_dim) Tensor: rows start.. are the new positions'
    sin_table: Any


class TensorBackend:
    """Named slots built from an ops class; a tensor carries one of these and never branches on device."""

    def __init__(self, ops: type, name: Optional[str] = None) -> None:
        self.ops = ops
        self.name = name or ops.__name__
        self.cuda = bool(getattr(ops, "cuda", False))
        for n in operators.UNARY:
            setattr(self, f"{n}_map", ops.map(n))
        for n in operators.BINARY:
            setattr(self, f"{n}_zip", ops.zip(n))
        self.add_reduce = ops.reduce("add", 0.0)
        self.mul_reduce = ops.reduce("mul", 1.0)
        self.max_reduce = ops.reduce("max", -math.inf)
        self.argmax = ops.argmax
        self.where = ops.where
        self.matrix_multiply = ops.matrix_multiply
        for n in ("softmax", "log_softmax", "rmsnorm", "layernorm", "rope", "embedding", "silu_mul",
                  "attention", "cat", "cast", "copy_", "empty", "asarray", "to_numpy"):
            setattr(self, n, getattr(ops, n))
        # x (R, K) @ PackedWeight^T into out (R, N), numpy arrays; None where the backend has no such kernel
        self.packed_linear = getattr(ops, "packed_linear", None)
        # a decoder stack's inference forward in one call (cpu/decoder.py) and its test of the weights; None
        # where the backend runs the model op by op only
        self.decoder_forward = getattr(ops, "decoder_forward", None)
        self.decoder_supports = getattr(ops, "decoder_supports", None)

    def __repr__(self) -> str:
        return f"TensorBackend({self.name})"


SimpleBackend = TensorBackend(SimpleOps, "SimpleBackend")
