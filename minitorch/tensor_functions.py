"""One Function per differentiable op (forward on the backend slots, backward with tensor ops),
plus tensor creation. Fused nn ops (softmax, rmsnorm, attention, ...) live in nn.py.

Function.apply records history only when grad mode is on and an input requires grad; otherwise it
calls forward with a shared null context and allocates nothing for autodiff.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence, Tuple

import numpy as np

from .autodiff import NULL_CTX, Context, _state
from .tensor_data import DTYPES, MiniTorchError, TensorData, apply_spec, prod, strides_from_shape

if TYPE_CHECKING:
    from .tensor import Tensor
    from .tensor_ops import TensorBackend


class History:
    """How a tensor was made: the Function, its saved context and its inputs."""

    __slots__ = ("last_fn", "ctx", "inputs")

    def __init__(self, last_fn: type, ctx: Context, inputs: tuple) -> None:
        self.last_fn = last_fn
        self.ctx = ctx
        self.inputs = inputs


class Function:
    """Base class: subclasses define forward(ctx, *inputs) -> Tensor and backward(ctx, grad) -> tuple."""

    @classmethod
    def apply(cls, *vals: Any) -> "Tensor":
        if _state["grad"]:
            for v in vals:
                if getattr(v, "requires_grad", False):
                    return cls._record(vals)
        return cls.forward(NULL_CTX, *vals)

    @classmethod
    def _record(cls, vals: tuple) -> "Tensor":
        ctx = Context()
        _state["grad"] = False  # the forward itself records nothing
        try:
            out = cls.forward(ctx, *vals)
        finally:
            _state["grad"] = True
        if any(out is v for v in vals):  # forward returned an input: never rewrite its record
            out = out._shallow()
        out.history = History(cls, ctx, vals)
        out.requires_grad = True
        return out

    @staticmethod
    def forward(ctx: Context, *vals: Any) -> "Tensor":
        raise NotImplementedError

    @staticmethod
    def backward(ctx: Context, grad: "Tensor") -> Tuple[Optional["Tensor"], ...]:
        raise NotImplementedError


# ---- elementwise -------------------------------------------------------------------------------

class Neg(Function):
    @staticmethod
    def forward(ctx, a):
        return a.backend.neg_map(a)

    @staticmethod
    def backward(ctx, g):
        return (-g,)


class Exp(Function):
    @staticmethod
    def forward(ctx, a):
        out = a.backend.exp_map(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_values
        return (g * out,)


class Log(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return a.backend.log_map(a)

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_values
        return (g / a,)


class Sqrt(Function):
    @staticmethod
    def forward(ctx, a):
        out = a.backend.sqrt_map(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_values
        return (g * 0.5 / out,)


class Rsqrt(Function):
    @staticmethod
    def forward(ctx, a):
        out = a.backend.rsqrt_map(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_values
        return (g * (out * out * out) * -0.5,)


class Sigmoid(Function):
    @staticmethod
    def forward(ctx, a):
        out = a.backend.sigmoid_map(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (s,) = ctx.saved_values
        return (g * s * (1.0 - s),)


class Relu(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return a.backend.relu_map(a)

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_values
        return (g * (a > 0.0),)


class Silu(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return a.backend.silu_map(a)

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_values
        s = a.sigmoid()
        return (g * (s * (1.0 + a * (1.0 - s))),)


class Tanh(Function):
    @staticmethod
    def forward(ctx, a):
        out = a.backend.tanh_map(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (t,) = ctx.saved_values
        return (g * (1.0 - t * t),)


class Add(Function):
    @staticmethod
    def forward(ctx, a, b):
        return a.backend.add_zip(a, b)

    @staticmethod
    def backward(ctx, g):
        return g, g


class Sub(Function):
    @staticmethod
    def forward(ctx, a, b):
        return a.backend.sub_zip(a, b)

    @staticmethod
    def backward(ctx, g):
        return g, -g


class Mul(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a.backend.mul_zip(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_values
        return g * b, g * a


class Div(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a.backend.div_zip(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_values
        gb = None
        if b.requires_grad:
            gb = -(g * a) / (b * b)
        return g / b, gb


class Pow(Function):
    @staticmethod
    def forward(ctx, a, b):
        out = a.backend.pow_zip(a, b)
        ctx.save_for_backward(a, b, out)
        return out

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_values[:2]
        out = ctx.saved_values[2]
        ga = g * b * (a ** (b - 1.0))
        gb = g * out * a.log() if b.requires_grad else None
        return ga, gb


class Compare(Function):
    """lt / gt / eq: float32 0/1, no gradient."""

    @staticmethod
    def backward(ctx, g):
        return None, None


class Lt(Compare):
    @staticmethod
    def forward(ctx, a, b):
        return a.backend.lt_zip(a, b)


class Gt(Compare):
    @staticmethod
    def forward(ctx, a, b):
        return a.backend.gt_zip(a, b)


class Eq(Compare):
    @staticmethod
    def forward(ctx, a, b):
        return a.backend.eq_zip(a, b)


class Where(Function):
    @staticmethod
    def forward(ctx, c, a, b):
        ctx.save_for_backward(c)
        return a.backend.where(c, a, b)

    @staticmethod
    def backward(ctx, g):
        (c,) = ctx.saved_values
        z = zeros((), backend=g.backend)
        return None, where(c, g, z), where(c, z, g)


# ---- reductions ---------------------------------------------------------------------------------

class Sum(Function):
    """Sum over one dim, keepdim."""

    @staticmethod
    def forward(ctx, a, dim):
        ctx.save(shape=a.shape)
        return a.backend.add_reduce(a, dim)

    @staticmethod
    def backward(ctx, g):
        return g.expand(*ctx.extra["shape"]), None


class Max(Function):
    """Max over one dim, keepdim; gradient split evenly among ties."""

    @staticmethod
    def forward(ctx, a, dim):
        out = a.backend.max_reduce(a, dim)
        ctx.save_for_backward(a, out)
        ctx.save(dim=dim)
        return out

    @staticmethod
    def backward(ctx, g):
        a, out = ctx.saved_values
        mask = a == out
        return g * mask / mask.sum(ctx.extra["dim"], keepdim=True), None


class MatMul(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a.backend.matrix_multiply(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_values
        ga = g @ b.transpose(-1, -2) if a.requires_grad else None
        gb = a.transpose(-1, -2) @ g if b.requires_grad else None
        return ga, gb


# ---- views and casts ----------------------------------------------------------------------------

class Permute(Function):
    @staticmethod
    def forward(ctx, a, order):
        ctx.save(order=order)
        return a._new(a._tensor.permute(order))

    @staticmethod
    def backward(ctx, g):
        order = ctx.extra["order"]
        inv = [0] * len(order)
        for i, o in enumerate(order):
            inv[o] = i
        return g.permute(*inv), None


class View(Function):
    @staticmethod
    def forward(ctx, a, shape):
        td = a._tensor
        if not td.is_contiguous():
            raise MiniTorchError(f"view of non-contiguous tensor (shape {td.shape}, strides {td.strides}); "
                                 "use reshape() or contiguous() first")
        ctx.save(shape=td.shape)
        return a._new(TensorData.make(td.storage, shape, strides_from_shape(shape), td.dtype, True))

    @staticmethod
    def backward(ctx, g):
        return g.reshape(*ctx.extra["shape"]), None


class Expand(Function):
    @staticmethod
    def forward(ctx, a, shape):
        from .tensor_data import broadcast_strides
        td = a._tensor
        return a._new(TensorData.make(td.storage, shape, broadcast_strides(td.shape, td.strides, shape),
                                      td.dtype))

    @staticmethod
    def backward(ctx, g):
        return g, None  # chain_rule sums the broadcast dims back


class Slice(Function):
    """A strided sub-view described by a normalized spec (see tensor_data.apply_spec)."""

    @staticmethod
    def forward(ctx, a, spec):
        td = a._tensor
        offset, shape, strides = apply_spec(td.shape, td.strides, spec)
        ctx.save(shape=td.shape, spec=spec)
        storage = td.storage[offset:] if offset else td.storage
        return a._new(TensorData.make(storage, shape, strides, td.dtype))

    @staticmethod
    def backward(ctx, g):
        z = zeros(ctx.extra["shape"], backend=g.backend, dtype=g.dtype)
        zt = z._tensor
        offset, vshape, vstrides = apply_spec(zt.shape, zt.strides, ctx.extra["spec"])
        storage = zt.storage[offset:] if offset else zt.storage
        z._new(TensorData.make(storage, vshape, vstrides, zt.dtype)).copy_(g)
        return z, None


class Contiguous(Function):
    @staticmethod
    def forward(ctx, a):
        if a._tensor.is_contiguous():
            return a
        return a.backend.id_map(a)

    @staticmethod
    def backward(ctx, g):
        return (g,)


class Cast(Function):
    @staticmethod
    def forward(ctx, a, dtype):
        ctx.save(dtype=a.dtype)
        return a.backend.cast(a, dtype)

    @staticmethod
    def backward(ctx, g):
        src = ctx.extra["dtype"]
        return (g.to(src) if src == "float32" else None), None


# ---- creation -----------------------------------------------------------------------------------

def _default_backend() -> "TensorBackend":
    from .fast_ops import FastBackend
    return FastBackend


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise MiniTorchError(f"dtype {dtype!r} not supported on CPU; use one of {sorted(DTYPES)}")


def from_numpy(arr: np.ndarray, backend: Optional["TensorBackend"] = None, dtype: Optional[str] = None) -> "Tensor":
    """Wrap a numpy array. float32/int64 CPU arrays with non-negative strides share memory (no copy);
    other dtypes are converted (float -> float32, int/bool -> int64 unless dtype says otherwise)."""
    from .tensor import Tensor
    backend = backend or _default_backend()
    arr = np.asarray(arr)
    if dtype is None:
        dtype = "int64" if arr.dtype.kind in "iub" else "float32"
    _check_dtype(dtype) if not backend.cuda else None
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
        return Tensor(TensorData(storage, arr.shape, strides, dtype), backend)
    arr = np.ascontiguousarray(arr)
    return Tensor(TensorData(backend.asarray(arr.reshape(-1)), arr.shape, None, dtype), backend)


def tensor(data: Any, backend: Optional["TensorBackend"] = None, dtype: str = "float32",
           requires_grad: bool = False) -> "Tensor":
    """A new tensor from nested lists / numbers / arrays (always a copy)."""
    _check_dtype(dtype)
    arr = np.array(data, dtype=DTYPES[dtype])
    t = from_numpy(arr, backend=backend, dtype=dtype)
    t.requires_grad = requires_grad
    return t


def _shape_arg(shape: Any) -> Tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise MiniTorchError(f"negative dimension in shape {shape}")
    return shape


def full(shape: Any, value: float, backend: Optional["TensorBackend"] = None, dtype: str = "float32") -> "Tensor":
    """A new tensor filled with value."""
    from .tensor import Tensor
    backend = backend or _default_backend()
    shape = _shape_arg(shape)
    storage = backend.empty(prod(shape), dtype)
    storage.fill(value)
    return Tensor(TensorData(storage, shape, None, dtype), backend)


def zeros(shape: Any, backend: Optional["TensorBackend"] = None, dtype: str = "float32") -> "Tensor":
    return full(shape, 0, backend=backend, dtype=dtype)


def ones(shape: Any, backend: Optional["TensorBackend"] = None, dtype: str = "float32") -> "Tensor":
    return full(shape, 1, backend=backend, dtype=dtype)


def arange(n: int, backend: Optional["TensorBackend"] = None, dtype: str = "int64") -> "Tensor":
    _check_dtype(dtype)
    return from_numpy(np.arange(n, dtype=DTYPES[dtype]), backend=backend, dtype=dtype)


def rand(shape: Any, backend: Optional["TensorBackend"] = None, seed: Optional[int] = None,
         requires_grad: bool = False) -> "Tensor":
    """Uniform [0, 1) float32 values (numpy generator, seedable)."""
    arr = np.random.default_rng(seed).random(_shape_arg(shape), dtype=np.float32)
    t = from_numpy(arr, backend=backend)
    t.requires_grad = requires_grad
    return t


def where(cond: "Tensor", a: Any, b: Any) -> "Tensor":
    """Elementwise cond != 0 ? a : b with broadcasting (a/b may be scalars)."""
    a = cond._lift(a) if not hasattr(a, "_tensor") else a
    b = cond._lift(b) if not hasattr(b, "_tensor") else b
    return Where.apply(cond, a, b)


def cat(tensors: Sequence["Tensor"], dim: int = 0) -> "Tensor":
    from .nn import cat as _cat
    return _cat(tensors, dim)
