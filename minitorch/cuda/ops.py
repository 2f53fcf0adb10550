"""CudaOps: the CUDA TensorBackend. Storage is a 1-D CuPy array (float32, int64, or uint16 holding
bf16 bits); matmuls go through cuBLAS (ctypes, fp32 accumulation), everything else through our
kernels (kernels/*.cu via launch.py). CuPy is imported lazily: `import minitorch.cuda` works
without a GPU and `make_cuda_backend()` then raises CudaUnavailableError("no GPU available: ...").

Dtypes: float32, int64 and "bfloat16". A Python scalar next to a bf16 tensor stays bf16 (as in
torch); a bf16 tensor next to a float32 tensor computes in float32.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Optional, Tuple

import numpy as np

from .. import operators
from ..tensor_data import MiniTorchError, TensorData, broadcast_strides, shape_broadcast
from ..tensor_ops import TensorBackend, TensorOps, matmul_shape, new_tensor
from . import launch as cl
from .blas import DTYPE_CODES, OP_N, OP_T, cublas
from .runtime import CudaUnavailableError, cuda_available, get_cupy, unavailable_reason

if TYPE_CHECKING:  # annotations only: a backend never needs the core's Tensor class at import time
    from ..tensor import Tensor

FLOATS = ("float32", "bfloat16")
REDUCE_NAMES = {"add": "sum", "mul": "prod", "max": "max"}


def _contig(x: Tensor) -> Tensor:
    return x if x._tensor.is_contiguous() else x.backend.id_map(x)


def _to(x: Tensor, dtype: str) -> Tensor:
    return x if x.dtype == dtype else x.backend.cast(x, dtype)


def _permute_last(x: Tensor, dim: int, fn: Callable[[Tensor], Tensor]) -> Tensor:
    """Run a last-dim row kernel over any dim by permuting it last and back (views)."""
    nd = x.dims
    if nd == 0 or dim == nd - 1:
        return fn(x)
    order = list(range(nd))
    order[dim], order[-1] = order[-1], order[dim]
    res = fn(x._new(x._tensor.permute(order)))
    return res._new(res._tensor.permute(order))


def _unify(name: str, a: Tensor, b: Tensor) -> Tuple[Tensor, Tensor, str]:
    """Common compute dtype: a 0-d/1-element float32 scalar adopts a bf16 partner's dtype."""
    da, db = a.dtype, b.dtype
    if da == db:
        if da == "int64" and name not in operators.INT_CLOSED and name not in operators.COMPARISONS:
            return _to(a, "float32"), _to(b, "float32"), "float32"
        return a, b, da
    if da == "bfloat16" and db == "float32" and b.size == 1:
        return a, _to(b, "bfloat16"), "bfloat16"
    if db == "bfloat16" and da == "float32" and a.size == 1:
        return _to(a, "bfloat16"), b, "bfloat16"
    return _to(a, "float32"), _to(b, "float32"), "float32"


def _ld_op(shape: Tuple[int, int], strides: Tuple[int, int]) -> Optional[Tuple[str, int]]:
    """How a 2-D strided matrix reads in BLAS: ('row', ld) row-major or ('col', ld); None if neither."""
    r, c = shape
    sr, sc = strides
    if c == 1 or sc == 1:
        ld = sr if r > 1 else c
        if ld >= max(c, 1):
            return "row", max(ld, 1)
    if r == 1 or sr == 1:
        ld = sc if c > 1 else r
        if ld >= max(r, 1):
            return "col", max(ld, 1)
    return None


def _batch_stride(shape: Tuple[int, ...], strides: Tuple[int, ...]) -> Optional[int]:
    """A single stride that walks a (broadcast) batch in row-major order, or None."""
    live = [(s, st) for s, st in zip(shape, strides) if s != 1]
    if not live:
        return 0
    if all(st == 0 for _, st in live):
        return 0
    for (s0, st0), (s1, st1) in zip(live, live[1:]):
        if st0 != st1 * s1:
            return None
    return live[-1][1]


class CudaOps(TensorOps):
    """Kernels from kernels/*.cu and cuBLAS; see module docstring."""

    cuda = True

    @staticmethod
    def empty(n: int, dtype: str) -> Any:
        if dtype not in cl.CUPY_DTYPES:
            raise MiniTorchError(f"dtype {dtype!r} not supported on CUDA; use float32, bfloat16 or int64")
        return get_cupy().empty(max(n, 1), dtype=cl.CUPY_DTYPES[dtype])[:n]

    @staticmethod
    def asarray(arr: np.ndarray) -> Any:
        return get_cupy().asarray(arr)

    @staticmethod
    def to_numpy(td: TensorData) -> np.ndarray:
        """A host copy with td's shape (bf16 converted to float32)."""
        if td.size == 0:
            return np.empty(td.shape, dtype=np.float32 if td.dtype == "bfloat16" else td.storage.dtype)
        span = 1 + sum((s - 1) * st for s, st in zip(td.shape, td.strides))
        host = td.storage[:span].get()
        if td.dtype == "bfloat16":
            host = (host.astype(np.uint32) << 16).view(np.float32)
        isz = host.itemsize
        return np.lib.stride_tricks.as_strided(host, td.shape, tuple(s * isz for s in td.strides)).copy()

    # ---- generic slots ----
    @staticmethod
    def map(name: str) -> Callable[..., Tensor]:
        if name not in cl.MAP_OPS:
            raise MiniTorchError(f"map {name!r} has no CUDA kernel")
        int_ok = name in operators.INT_CLOSED

        def _map(a: Tensor, out: Optional[Tensor] = None) -> Tensor:
            if out is None:
                dt = a.dtype if (a.dtype in FLOATS or int_ok) else "float32"
                out = new_tensor(a.backend, a.shape, dt)
            else:
                broadcast_strides(a.shape, a.strides, out.shape)  # raises naming the shapes
            at, ot = a._tensor, out._tensor
            if name == "id":
                cl.cast(at, ot)
            elif at.dtype == ot.dtype:
                cl.map_op(name, at, ot)
            else:
                tmp = new_tensor(a.backend, a.shape, ot.dtype)
                cl.cast(at, tmp._tensor)
                cl.map_op(name, tmp._tensor, ot)
            return out

        return _map

    @staticmethod
    def zip(name: str) -> Callable[..., Tensor]:
        if name not in cl.ZIP_OPS:
            raise MiniTorchError(f"zip {name!r} has no CUDA kernel")

        def _zip(a: Tensor, b: Tensor, out: Optional[Tensor] = None) -> Tensor:
            if a.backend is not b.backend:
                raise MiniTorchError(f"tensors on different backends: {a.backend.name} and {b.backend.name}")
            a, b, dt = _unify(name, a, b)
            shape = a.shape if a.shape == b.shape else shape_broadcast(a.shape, b.shape)
            odt = "float32" if name in operators.COMPARISONS else dt
            if out is None:
                out = new_tensor(a.backend, shape, odt)
            elif shape_broadcast(shape, out.shape) != out.shape:
                raise MiniTorchError(f"result of shapes {a.shape} and {b.shape} does not fit out of shape {out.shape}")
            if out.dtype == odt or (odt == "float32" and out.dtype == dt):
                if out.shape == shape:
                    cl.zip_op(name, a._tensor, b._tensor, out._tensor)
                    return out
            tmp = new_tensor(a.backend, shape, odt)
            cl.zip_op(name, a._tensor, b._tensor, tmp._tensor)
            cl.cast(tmp._tensor, out._tensor)
            return out

        return _zip

    @staticmethod
    def where(c: Tensor, a: Tensor, b: Tensor, out: Optional[Tensor] = None) -> Tensor:
        a, b, dt = _unify("add", a, b)
        shape = shape_broadcast(shape_broadcast(a.shape, b.shape), c.shape)
        if out is None:
            out = new_tensor(a.backend, shape, dt)
        elif out.shape != shape:
            raise MiniTorchError(f"where: result shape {shape} does not match out of shape {out.shape}")
        c = _to(c, "float32")
        if out.dtype == dt:
            cl.where(c._tensor, a._tensor, b._tensor, out._tensor)
        else:
            tmp = new_tensor(a.backend, shape, dt)
            cl.where(c._tensor, a._tensor, b._tensor, tmp._tensor)
            cl.cast(tmp._tensor, out._tensor)
        return out

    @staticmethod
    def reduce(name: str, start: float) -> Callable[[Tensor, int], Tensor]:
        op = REDUCE_NAMES[name]

        def _reduce(a: Tensor, dim: int) -> Tensor:
            shape = list(a.shape)
            n = shape[dim]
            shape[dim] = 1
            out = new_tensor(a.backend, tuple(shape), a.dtype)
            if out.size == 0:
                return out
            if n == 0:
                if name == "max":
                    raise MiniTorchError(f"max over an empty dim {dim} of shape {a.shape}")
                cl.fill(out._tensor, start)
                return out
            cl.reduce(op, a._tensor, dim, out._tensor)
            return out

        return _reduce

    @staticmethod
    def argmax(a: Tensor, dim: int) -> Tensor:
        n = a.shape[dim]
        if n == 0:
            raise MiniTorchError(f"argmax over an empty dim {dim} of shape {a.shape}")
        x = a if a.dtype in FLOATS else _to(a, "float32")
        order = list(range(a.dims))
        order[dim], order[-1] = order[-1], order[dim]              # a swap is its own inverse
        moved = _contig(x._new(x._tensor.permute(order)) if dim != a.dims - 1 else x)
        rows = moved.size // n
        flat = new_tensor(a.backend, (rows,), "int64")
        cl.argmax_rows(cl.View(moved._tensor.storage, (rows, n), (n, 1), moved.dtype), flat._tensor)
        kshape = list(moved.shape)
        kshape[-1] = 1
        res = flat.view(*kshape)                                   # (..., 1) with dim moved last
        return res if dim == a.dims - 1 else res._new(res._tensor.permute(order))

    @staticmethod
    def matrix_multiply(a: Tensor, b: Tensor, out: Optional[Tensor] = None) -> Tensor:
        shape = matmul_shape(a, b)
        dt = a.dtype
        if dt == "int64":
            res = CudaOps.matrix_multiply(_to(a, "float32"), _to(b, "float32"))
            return res.backend.cast(res, "int64") if out is None else out.copy_(res)
        target = out
        if out is None or out.dtype != dt or not out._tensor.is_contiguous():
            out = new_tensor(a.backend, shape, dt)
        elif out.shape != shape:
            raise MiniTorchError(f"matmul result shape {shape} does not match out of shape {out.shape}")
        if out.size:
            _gemm(a, b, out, shape)
        if target is not None and target is not out:
            target.copy_(out)
            return target
        return out

    # ---- fused ----
    @staticmethod
    def softmax(x: Tensor, dim: int) -> Tensor:
        return _permute_last(_float(x), dim, lambda t: _softmax_last(t, False))

    @staticmethod
    def log_softmax(x: Tensor, dim: int) -> Tensor:
        return _permute_last(_float(x), dim, lambda t: _softmax_last(t, True))

    @staticmethod
    def rmsnorm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
        x = _contig(_float(x))
        w = _contig(_to(weight, x.dtype))
        out = new_tensor(x.backend, x.shape, x.dtype)
        if out.size:
            cl.rmsnorm(x._tensor, w._tensor, out._tensor, eps)
        return out

    @staticmethod
    def layernorm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
        x = _contig(_float(x))
        w = _contig(_to(weight, x.dtype))
        b = _contig(_to(bias, x.dtype)) if bias is not None else None
        out = new_tensor(x.backend, x.shape, x.dtype)
        if out.size:
            cl.layernorm(x._tensor, w._tensor, b._tensor if b is not None else None, out._tensor, eps)
        return out

    @staticmethod
    def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x = _contig(_float(x))
        t_len, d = x.shape[-2], x.shape[-1]
        if cos.size != t_len * d or sin.size != t_len * d:  # broadcasting beyond (T, D): reference path
            return TensorOps.rope(x, cos, sin)
        c = _contig(_to(cos, x.dtype)).view(t_len, d)
        s = _contig(_to(sin, x.dtype)).view(t_len, d)
        out = new_tensor(x.backend, x.shape, x.dtype)
        if out.size:
            cl.rope(x._tensor, c._tensor, s._tensor, out._tensor)
        return out

    @staticmethod
    def embedding(weight: Tensor, ids: Tensor) -> Tensor:
        w, i = _contig(weight), _contig(ids)
        v, d = w.shape
        if i.size:
            host = i.to_numpy()
            lo, hi = int(host.min()), int(host.max())
            if lo < 0 or hi >= v:
                bad = lo if lo < 0 else hi
                raise MiniTorchError(f"embedding: id {bad} out of range for {v} rows (ids shape {ids.shape})")
        out = new_tensor(w.backend, ids.shape + (d,), w.dtype)
        if out.size:
            cl.embedding(w._tensor, i._tensor, cl.View(out._tensor.storage, (i.size, d), (d, 1), w.dtype))
        return out

    @staticmethod
    def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
        if gate.shape != up.shape or gate.dtype != up.dtype:
            return TensorOps.silu_mul(gate, up)
        g, u = _contig(_float(gate)), _contig(_float(up))
        out = new_tensor(g.backend, g.shape, g.dtype)
        if out.size:
            cl.silu_mul(g._tensor, u._tensor, out._tensor)
        return out

    @staticmethod
    def attention(q: Tensor, k: Tensor, v: Tensor, scale: float, q_start: int) -> Tensor:
        dt = q.dtype if q.dtype == k.dtype == v.dtype and q.dtype in FLOATS else "float32"
        q, k, v = (_last_contig(_to(t, dt)) for t in (q, k, v))
        out = new_tensor(q.backend, q.shape, dt)
        if out.size:
            cl.attention(q._tensor, k._tensor, v._tensor, out._tensor, float(scale), int(q_start))
        return out


def _float(x: Tensor) -> Tensor:
    return x if x.dtype in FLOATS else _to(x, "float32")


def _last_contig(x: Tensor) -> Tensor:
    return x if x.strides[-1] == 1 or x.shape[-1] == 1 else x.backend.id_map(x)


def _softmax_last(x: Tensor, log: bool) -> Tensor:
    x = _contig(x)
    out = new_tensor(x.backend, x.shape, x.dtype)
    if out.size:
        cl.softmax(x._tensor, out._tensor, log=log)
    return out


def _gemm(a: Tensor, b: Tensor, out: Tensor, shape: Tuple[int, ...]) -> None:
    """out (contiguous, batch + (M, N)) = a @ b through cuBLAS (strided-batched when needed)."""
    batch = shape[:-2]
    M, N, K = shape[-2], shape[-1], a.shape[-1]
    nb = math.prod(batch) if batch else 1
    ops = []
    for t in (a, b):
        lay = _ld_op(t.shape[-2:], t.strides[-2:])
        bst = _batch_stride(batch, broadcast_strides(t.shape[:-2], t.strides[:-2], batch)) if batch else 0
        if lay is None or bst is None:
            t = t.backend.id_map(t.expand(*(batch + t.shape[-2:])) if batch else t)  # contiguous copy
            lay = _ld_op(t.shape[-2:], t.strides[-2:])
            bst = (t.shape[-2] * t.shape[-1]) if batch else 0
        ops.append((t, lay, bst))
    (ta, (la, lda), sa), (tb, (lb, ldb), sb) = ops
    code = DTYPE_CODES[a.dtype]
    # column-major C^T (N x M) = op(B) (N x K) @ op(A) (K x M)
    opb = OP_N if lb == "row" else OP_T
    opa = OP_N if la == "row" else OP_T
    pa, pb, pc = ta._tensor.storage.data.ptr, tb._tensor.storage.data.ptr, out._tensor.storage.data.ptr
    if nb == 1:
        cublas().gemm(opb, opa, N, M, K, pb, code, ldb, pa, code, lda, pc, code, N)
    else:
        cublas().gemm_batched(opb, opa, N, M, K, pb, code, ldb, sb, pa, code, lda, sa, pc, code, N, M * N, nb)


_backend: Optional[TensorBackend] = None


def make_cuda_backend() -> TensorBackend:
    """The CUDA TensorBackend (one per process); CudaUnavailableError ('no GPU available: ...') if
    CuPy or a GPU is missing."""
    global _backend
    if _backend is None:
        if not cuda_available():
            raise CudaUnavailableError(unavailable_reason())
        _backend = TensorBackend(CudaOps, "CudaBackend")
    return _backend


__all__ = ["CudaOps", "make_cuda_backend", "cuda_available", "CudaUnavailableError"]
