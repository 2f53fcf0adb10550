"""Functional nn ops. Each validates its inputs (MiniTorchError naming shapes/dims), runs one backend
slot in forward (a fused kernel on FastOps/CUDA, the reference composition on SimpleOps) and has an
explicit backward written with tensor ops.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from .autodiff import Context, is_grad_enabled
from .packed import PackedWeight
from .tensor import Tensor
from .tensor_data import MiniTorchError, broadcast_strides, norm_dim
from .tensor_functions import Cat, Function, cat, from_numpy, zeros  # noqa: F401  (Cat, cat: re-export)
from .tensor_ops import causal_mask


def _need_float(x: Tensor, what: str) -> None:
    if x.dtype == "int64":
        raise MiniTorchError(f"{what} needs a float tensor, got {x.dtype} of shape {x.shape}")


class Softmax(Function):
    @staticmethod
    def forward(ctx: Context, x: Tensor, dim: int) -> Tensor:
        out = x.backend.softmax(x, dim)
        ctx.save_for_backward(out)
        ctx.save(dim=dim)
        return out

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        (y,) = ctx.saved_values
        return y * (g - (g * y).sum(ctx.extra["dim"], keepdim=True)), None


class LogSoftmax(Function):
    @staticmethod
    def forward(ctx: Context, x: Tensor, dim: int) -> Tensor:
        out = x.backend.log_softmax(x, dim)
        ctx.save_for_backward(out)
        ctx.save(dim=dim)
        return out

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        (y,) = ctx.saved_values
        return g - y.exp() * g.sum(ctx.extra["dim"], keepdim=True), None


class RMSNorm(Function):
    @staticmethod
    def forward(ctx: Context, x: Tensor, w: Tensor, eps: float) -> Tensor:
        ctx.save_for_backward(x, w)
        ctx.save(eps=eps)
        return x.backend.rmsnorm(x, w, eps)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        x, w = ctx.saved_values
        r = ((x * x).mean(-1, keepdim=True) + ctx.extra["eps"]).rsqrt()
        xhat = x * r
        gx = g * w
        dx = r * (gx - xhat * (gx * xhat).mean(-1, keepdim=True))
        return dx, g * xhat, None


class LayerNorm(Function):
    @staticmethod
    def forward(ctx: Context, x: Tensor, w: Tensor, b: Tensor, eps: float) -> Tensor:
        ctx.save_for_backward(x, w)
        ctx.save(eps=eps)
        return x.backend.layernorm(x, w, b, eps)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        x, w = ctx.saved_values
        xc = x - x.mean(-1, keepdim=True)
        r = ((xc * xc).mean(-1, keepdim=True) + ctx.extra["eps"]).rsqrt()
        xhat = xc * r
        gx = g * w
        dx = r * (gx - gx.mean(-1, keepdim=True) - xhat * (gx * xhat).mean(-1, keepdim=True))
        return dx, g * xhat, g, None


class Embedding(Function):
    @staticmethod
    def forward(ctx: Context, w: Tensor, ids: Tensor) -> Tensor:
        ctx.save_for_backward(ids)
        ctx.save(shape=w.shape)
        return w.backend.embedding(w, ids)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        (ids,) = ctx.saved_values
        v, d = ctx.extra["shape"]
        gw = np.zeros((v, d), dtype=np.float32)
        np.add.at(gw, np.asarray(ids.to_numpy()).reshape(-1), np.asarray(g.to_numpy()).reshape(-1, d))  # scatter-add
        return from_numpy(gw, backend=g.backend), None


def _rotate_half(x: Tensor) -> Tensor:
    h = x.shape[-1] // 2
    return cat([-x.narrow(-1, h, h), x.narrow(-1, 0, h)], -1)


def _rotate_half_t(y: Tensor) -> Tensor:
    """Transpose of rotate_half: cat(y2, -y1)."""
    h = y.shape[-1] // 2
    return cat([y.narrow(-1, h, h), -y.narrow(-1, 0, h)], -1)


class Rope(Function):
    @staticmethod
    def forward(ctx: Context, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        ctx.save_for_backward(x, cos, sin)
        return x.backend.rope(x, cos, sin)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        x, cos, sin = ctx.saved_values
        dx = g * cos + _rotate_half_t(g * sin)
        dc = g * x if cos.requires_grad else None
        ds = g * _rotate_half(x) if sin.requires_grad else None
        return dx, dc, ds


class SiluMul(Function):
    @staticmethod
    def forward(ctx: Context, gate: Tensor, up: Tensor) -> Tensor:
        ctx.save_for_backward(gate, up)
        return gate.backend.silu_mul(gate, up)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        gate, up = ctx.saved_values
        s = gate.sigmoid()
        return g * up * (s * (1.0 + gate * (1.0 - s))), g * (gate * s)


class Attention(Function):
    @staticmethod
    def forward(ctx: Context, q: Tensor, k: Tensor, v: Tensor, scale: float, q_start: int) -> Tensor:
        ctx.save_for_backward(q, k, v)
        ctx.save(scale=scale, q_start=q_start)
        return q.backend.attention(q, k, v, scale, q_start)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple:
        q, k, v = ctx.saved_values
        scale, q_start = ctx.extra["scale"], ctx.extra["q_start"]
        b, hq, t, d = q.shape
        hkv, length = k.shape[1], k.shape[2]
        grp = hq // hkv
        qg = q.reshape(b, hkv, grp * t, d)                                  # (B, Hkv, G*T, D)
        s = (qg @ k.transpose(2, 3)) * scale                                # (B, Hkv, G*T, L)
        mask = from_numpy(causal_mask(t, grp, q_start, length), backend=q.backend)
        p = q.backend.softmax(s.masked_fill(mask, -math.inf), 3)
        go = g.reshape(b, hkv, grp * t, d)                                  # (B, Hkv, G*T, D)
        dv = p.transpose(2, 3) @ go                                         # (B, Hkv, L, D)
        dp = go @ v.transpose(2, 3)                                         # (B, Hkv, G*T, L)
        ds = p * (dp - (dp * p).sum(3, keepdim=True))
        dq = ((ds @ k) * scale).view(b, hq, t, d)                           # (B, Hq, T, D)
        dk = (ds.transpose(2, 3) @ qg) * scale                              # (B, Hkv, L, D)
        return dq, dk, dv, None, None


# ---- public functions -------------------------------------------------------------------------

def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Numerically stable softmax over dim."""
    _need_float(x, "softmax")
    return Softmax.apply(x, norm_dim(dim, x.dims, x.shape))


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Numerically stable log-softmax over dim."""
    _need_float(x, "log_softmax")
    return LogSoftmax.apply(x, norm_dim(dim, x.dims, x.shape))


def _check_vec(w: Tensor, n: int, what: str, x: Tensor) -> None:
    if w.shape != (n,):
        raise MiniTorchError(f"{what} has shape {w.shape}, expected ({n},) for input of shape {x.shape}")


def rmsnorm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """x * rsqrt(mean(x^2, -1) + eps) * weight, in float32."""
    _need_float(x, "rmsnorm")
    if x.dims == 0:
        raise MiniTorchError("rmsnorm needs at least 1 dim")
    _check_vec(weight, x.shape[-1], "rmsnorm weight", x)
    return RMSNorm.apply(x, weight, float(eps))


def layernorm(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dim."""
    _need_float(x, "layernorm")
    if x.dims == 0:
        raise MiniTorchError("layernorm needs at least 1 dim")
    _check_vec(weight, x.shape[-1], "layernorm weight", x)
    _check_vec(bias, x.shape[-1], "layernorm bias", x)
    return LayerNorm.apply(x, weight, bias, float(eps))


def embedding(weight: Tensor, ids: Tensor) -> Tensor:
    """Rows of weight (V, D) picked by int64 ids of any shape -> ids.shape + (D,)."""
    if isinstance(weight, PackedWeight):
        return packed_embedding(weight, ids)
    if weight.dims != 2:
        raise MiniTorchError(f"embedding weight must be (V, D), got shape {weight.shape}")
    if ids.dtype != "int64":
        raise MiniTorchError(f"embedding ids must be int64, got {ids.dtype} of shape {ids.shape}")
    return Embedding.apply(weight, ids)


def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding x*cos + rotate_half(x)*sin, x (..., T, D), cos/sin broadcastable to (T, D)."""
    _need_float(x, "rope")
    if x.dims < 2 or x.shape[-1] % 2:
        raise MiniTorchError(f"rope needs x of shape (..., T, D) with even D, got {x.shape}")
    td = x.shape[-2:]
    for name, c in (("cos", cos), ("sin", sin)):
        if any(s != 1 for s in c.shape[:-2]):
            raise MiniTorchError(f"rope {name} of shape {c.shape} must broadcast to (T, D) = {td}")
        broadcast_strides(c.shape[-2:], c.strides[-2:], td)
    return Rope.apply(x, cos, sin)


def packed_linear(x: Tensor, weight: PackedWeight, bias: Optional[Tensor] = None) -> Tensor:
    """x (..., K) @ weight^T + bias for a packed weight; the backend's `packed_linear` slot does the product."""
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


def packed_embedding(weight: PackedWeight, ids: Tensor) -> Tensor:
    """Rows of a packed (V, D) weight for int64 ids -> ids.shape + (D,) float32 tensor."""
    if ids.dtype != "int64":
        raise MiniTorchError(f"embedding ids must be int64, got {ids.dtype} of shape {ids.shape}")
    return from_numpy(weight.rows(ids.to_numpy()), backend=ids.backend)


def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """x @ weight^T + bias, weight (out, in) as stored in checkpoints (the transpose is a view) or a
    PackedWeight (GGUF block-quantized, inference only; see minitorch/packed.py)."""
    if isinstance(weight, PackedWeight):
        return packed_linear(x, weight, bias)
    if weight.dims != 2 or x.dims == 0 or x.shape[-1] != weight.shape[1]:
        raise MiniTorchError(f"linear: input {x.shape} does not match weight (out, in) = {weight.shape}")
    wt = weight.transpose(0, 1)                                   # (in, out) view, no copy
    y = x @ wt if x.dims >= 2 else (x.view(1, x.shape[0]) @ wt).view(weight.shape[0])
    if bias is not None:
        if bias.shape != (weight.shape[0],):
            raise MiniTorchError(f"linear bias shape {bias.shape} != ({weight.shape[0]},)")
        y = y + bias
    return y


def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up (SwiGLU)."""
    if gate.shape != up.shape:
        raise MiniTorchError(f"silu_mul shapes differ: gate {gate.shape}, up {up.shape}")
    _need_float(gate, "silu_mul")
    return SiluMul.apply(gate, up)


def attention(q: Tensor, k: Tensor, v: Tensor, scale: Optional[float] = None, q_start: int = 0) -> Tensor:
    """Causal grouped-query attention: q (B,Hq,T,D), k/v (B,Hkv,L,D); query i is at position q_start+i
    and sees keys 0..q_start+i. scale defaults to D**-0.5."""
    if q.dims != 4 or k.dims != 4 or v.dims != 4:
        raise MiniTorchError(f"attention needs 4-d q, k, v; got {q.shape}, {k.shape}, {v.shape}")
    b, hq, t, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise MiniTorchError(f"attention shapes do not match: q {q.shape}, k {k.shape}, v {v.shape}")
    hkv, length = k.shape[1], k.shape[2]
    if hkv == 0 or hq % hkv:
        raise MiniTorchError(f"attention: {hq} query heads not a multiple of {hkv} kv heads")
    if q_start < 0 or length < q_start + t:
        raise MiniTorchError(f"attention: keys length {length} < q_start {q_start} + T {t}")
    for x in (q, k, v):
        _need_float(x, "attention")
    return Attention.apply(q, k, v, float(d ** -0.5 if scale is None else scale), int(q_start))
