"""One Function per differentiable op (forward on the backend slots, backward with tensor ops),
plus tensor creation. Fused nn ops (softmax, rmsnorm, attention, ...) live in nn.py.

Function.apply records history only when grad mode is on and an input requires grad; otherwise it
calls forward with a shared null context and allocates nothing for autodiff.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence, Tuple

from .autodiff import NULL_CTX, Context, _state
from .tensor_creation import arange, from_numpy, full, ones, rand, tensor, zeros  # noqa: F401 (re-export)
from .tensor_data import MiniTorchError, TensorData, apply_spec, contiguous_strides, norm_dim

if TYPE_CHECKING:
    from .tensor import Tensor


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
    def forward(ctx: Context, a: Tensor) -> Tensor:
        return a.backend.neg_map(a)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        return (-g,)


class Exp(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor) -> Tensor:
        out = a.backend.exp_map(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        (out,) = ctx.saved_values
        return (g * out,)


class Log(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor) -> Tensor:
        ctx.save_for_backward(a)
        return a.backend.log_map(a)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        (a,) = ctx.saved_values
        return (g / a,)


class Sqrt(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor) -> Tensor:
        out = a.backend.sqrt_map(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        (out,) = ctx.saved_values
        return (g * 0.5 / out,)


class Rsqrt(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor) -> Tensor:
        out = a.backend.rsqrt_map(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        (out,) = ctx.saved_values
        return (g * (out * out * out) * -0.5,)


class Sigmoid(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor) -> Tensor:
        out = a.backend.sigmoid_map(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        (s,) = ctx.saved_values
        return (g * s * (1.0 - s),)


class Relu(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor) -> Tensor:
        ctx.save_for_backward(a)
        return a.backend.relu_map(a)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        (a,) = ctx.saved_values
        return (g * (a > 0.0),)


class Silu(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor) -> Tensor:
        ctx.save_for_backward(a)
        return a.backend.silu_map(a)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        (a,) = ctx.saved_values
        s = a.sigmoid()
        return (g * (s * (1.0 + a * (1.0 - s))),)


class Tanh(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor) -> Tensor:
        out = a.backend.tanh_map(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        (t,) = ctx.saved_values
        return (g * (1.0 - t * t),)


class Add(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
        return a.backend.add_zip(a, b)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        return g, g


class Sub(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
        return a.backend.sub_zip(a, b)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        return g, -g


class Mul(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
        ctx.save_for_backward(a, b)
        return a.backend.mul_zip(a, b)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        a, b = ctx.saved_values
        return g * b, g * a


class Div(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
        ctx.save_for_backward(a, b)
        return a.backend.div_zip(a, b)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        a, b = ctx.saved_values
        gb = None
        if b.requires_grad:
            gb = -(g * a) / (b * b)
        return g / b, gb


class Pow(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
        out = a.backend.pow_zip(a, b)
        ctx.save_for_backward(a, b, out)
        return out

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        a, b = ctx.saved_values[:2]
        out = ctx.saved_values[2]
        ga = g * b * (a ** (b - 1.0))
        gb = g * out * a.log() if b.requires_grad else None
        return ga, gb


class Compare(Function):
    """lt / gt / eq: float32 0/1, no gradient."""

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        return None, None


class Lt(Compare):
    @staticmethod
    def forward(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
        return a.backend.lt_zip(a, b)


class Gt(Compare):
    @staticmethod
    def forward(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
        return a.backend.gt_zip(a, b)


class Eq(Compare):
    @staticmethod
    def forward(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
        return a.backend.eq_zip(a, b)


class Where(Function):
    @staticmethod
    def forward(ctx: Context, c: Tensor, a: Tensor, b: Tensor) -> Tensor:
        ctx.save_for_backward(c)
        return a.backend.where(c, a, b)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        (c,) = ctx.saved_values
        z = zeros((), backend=g.backend)
        return None, where(c, g, z), where(c, z, g)


# ---- reductions ---------------------------------------------------------------------------------

class Sum(Function):
    """Sum over one dim, keepdim."""

    @staticmethod
    def forward(ctx: Context, a: Tensor, dim: int) -> Tensor:
        ctx.save(shape=a.shape)
        return a.backend.add_reduce(a, dim)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        return g.expand(*ctx.extra["shape"]), None


class Max(Function):
    """Max over one dim, keepdim; gradient split evenly among ties."""

    @staticmethod
    def forward(ctx: Context, a: Tensor, dim: int) -> Tensor:
        out = a.backend.max_reduce(a, dim)
        ctx.save_for_backward(a, out)
        ctx.save(dim=dim)
        return out

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        a, out = ctx.saved_values
        mask = a == out
        return g * mask / mask.sum(ctx.extra["dim"], keepdim=True), None


class MatMul(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
        ctx.save_for_backward(a, b)
        return a.backend.matrix_multiply(a, b)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        a, b = ctx.saved_values
        ga = g @ b.transpose(-1, -2) if a.requires_grad else None
        gb = _matmul_weight_grad(a, b, g) if b.requires_grad else None
        return ga, gb


def _matmul_weight_grad(a: Tensor, b: Tensor, g: Tensor) -> Tensor:
    """d(a @ b)/db for the output gradient g. A 2-D b (a weight) shared by a's batch dims gets one product over
    all of a's rows, a^T (K, rows) @ g (rows, N), instead of a batch of products summed afterwards (a (batch, K,
    N) buffer and a reduction over it); and it comes out in b's own memory order, so a transposed weight's (the
    view nn.linear multiplies by) is contiguous once transposed back and its gradients add as contiguous arrays."""
    if b.dims != 2:
        return a.transpose(-1, -2) @ g
    a2 = a if a.dims == 2 else a.reshape(-1, a.shape[-1])  # (rows, K)
    g2 = g if g.dims == 2 else g.reshape(-1, g.shape[-1])  # (rows, N)
    st = b._tensor.strides
    if b.shape[0] > 1 and b.shape[1] > 1 and st[0] == 1 and st[1] == b.shape[0]:  # b is a transposed view
        return (g2.transpose(0, 1) @ a2).transpose(0, 1)
    return a2.transpose(0, 1) @ g2


# ---- views and casts ----------------------------------------------------------------------------

class Permute(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor, order: tuple) -> Tensor:
        ctx.save(order=order)
        return a._new(a._tensor.permute(order))

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        order = ctx.extra["order"]
        inv = [0] * len(order)
        for i, o in enumerate(order):
            inv[o] = i
        return g.permute(*inv), None


class View(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor, shape: tuple) -> Tensor:
        td = a._tensor
        if not td.is_contiguous():
            raise MiniTorchError(f"view of non-contiguous tensor (shape {td.shape}, strides {td.strides}); "
                                 "use reshape() or contiguous() first")
        ctx.save(shape=td.shape)
        return a._new(TensorData.make(td.storage, shape, contiguous_strides(shape), td.dtype, True))

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        return g.reshape(*ctx.extra["shape"]), None


class Expand(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor, shape: tuple) -> Tensor:
        from .tensor_data import broadcast_strides
        td = a._tensor
        return a._new(TensorData.make(td.storage, shape, broadcast_strides(td.shape, td.strides, shape),
                                      td.dtype))

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        return g, None  # chain_rule sums the broadcast dims back


class Slice(Function):
    """A strided sub-view described by a normalized spec (see tensor_data.apply_spec)."""

    @staticmethod
    def forward(ctx: Context, a: Tensor, spec: tuple) -> Tensor:
        td = a._tensor
        offset, shape, strides = apply_spec(td.shape, td.strides, spec)
        ctx.save(shape=td.shape, spec=spec)
        storage = td.storage[offset:] if offset else td.storage
        return a._new(TensorData.make(storage, shape, strides, td.dtype))

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        z = zeros(ctx.extra["shape"], backend=g.backend, dtype=g.dtype)
        zt = z._tensor
        offset, vshape, vstrides = apply_spec(zt.shape, zt.strides, ctx.extra["spec"])
        storage = zt.storage[offset:] if offset else zt.storage
        z._new(TensorData.make(storage, vshape, vstrides, zt.dtype)).copy_(g)
        return z, None


class Contiguous(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor) -> Tensor:
        if a._tensor.is_contiguous():
            return a
        return a.backend.id_map(a)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        return (g,)


class Cast(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor, dtype: str) -> Tensor:
        ctx.save(dtype=a.dtype)
        return a.backend.cast(a, dtype)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        src = ctx.extra["dtype"]
        return (g.to(src) if src == "float32" else None), None


class Cat(Function):
    @staticmethod
    def forward(ctx: Context, dim: int, *ts: "Tensor") -> "Tensor":
        ctx.save(dim=dim, sizes=[t.shape[dim] for t in ts])
        return ts[0].backend.cat(ts, dim)

    @staticmethod
    def backward(ctx: Context, g: "Tensor") -> tuple:
        dim, sizes = ctx.extra["dim"], ctx.extra["sizes"]
        out, off = [None], 0
        for n in sizes:
            out.append(g.narrow(dim, off, n))
            off += n
        return tuple(out)


# ---- op wrappers ------------------------------------------------------------------------------

def where(cond: "Tensor", a: Any, b: Any) -> "Tensor":
    """Elementwise cond != 0 ? a : b with broadcasting (a/b may be scalars)."""
    a = cond._lift(a) if not hasattr(a, "_tensor") else a
    b = cond._lift(b) if not hasattr(b, "_tensor") else b
    return Where.apply(cond, a, b)


def cat(tensors: Sequence["Tensor"], dim: int = 0) -> "Tensor":
    """Concatenate along dim (all other dims equal)."""
    ts = list(tensors)
    if not ts:
        raise MiniTorchError("cat of an empty list")
    t0 = ts[0]
    d = norm_dim(dim, t0.dims, t0.shape)
    for t in ts[1:]:
        if t.dims != t0.dims or any(a != b for i, (a, b) in enumerate(zip(t.shape, t0.shape)) if i != d):
            raise MiniTorchError(f"cat along dim {dim}: shapes {t0.shape} and {t.shape} differ off that dim")
        if t.dtype != t0.dtype:
            raise MiniTorchError(f"cat: dtypes {t0.dtype} and {t.dtype} differ")
    return Cat.apply(d, *ts)
