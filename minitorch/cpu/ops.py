"""FastOps: the numba CPU backend. Generic strided map / zip / where / reduce kernels (kernels.py),
fused kernels (fused.py) and float32 matmul through numpy's BLAS on strided views (no copies:
a weight stored (out, in) and used transposed is passed to BLAS as a transposed operand), except 1-16-row
activations against such a weight (decode and verify steps), which take the skinny numba kernel
(matmul.py), and packed weights (packed.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np

from .. import operators
from ..tensor_data import MiniTorchError, broadcast_strides
from ..tensor_ops import (TensorBackend, TensorOps, argmax_out, check_writable, map_out, matmul_shape, new_tensor,
                         where_prepare, zip_prepare)
from . import decoder as fd
from . import fused as ff
from . import kernels as fk
from . import matmul as fm
from . import packed as fp

if TYPE_CHECKING:  # annotations only: a backend never needs the core's Tensor class at import time
    from ..tensor import Tensor

_I64 = np.int64
# multiply-adds above which attention spreads (batch, kv head) tasks over threads; decode steps stay
# serial so an oversubscribed machine does not stall on thread wake-ups
PARALLEL_ATTENTION_WORK = 1 << 23


def _meta(shape: Sequence[int], *strides: Sequence[int]):
    """int64 arrays for kernels; a 0-d index space becomes one element."""
    if len(shape) == 0:
        return (np.ones(1, _I64),) + tuple(np.zeros(1, _I64) for _ in strides)
    return (np.array(shape, _I64),) + tuple(np.array(s, _I64) for s in strides)


def _contig(x: Tensor) -> Tensor:
    return x if x._tensor.is_contiguous() else x.backend.id_map(x)


def _last_dim(x: Tensor, dim: int, fn: Callable[[Tensor], Tensor]) -> Tensor:
    """Run a last-dim row kernel over any dim by permuting it last (a view) and back."""
    nd = x.dims
    if dim == nd - 1 or nd == 0:
        return fn(x)
    order = list(range(nd))
    order[dim], order[-1] = order[-1], order[dim]
    res = fn(x._new(x._tensor.permute(order)))
    return res._new(res._tensor.permute(order))


class FastOps(TensorOps):
    """numba kernels (cache=True); see module docstring."""

    # packed (GGUF block-quantized) weights: rebuilt row by row inside the numba kernel (packed.py)
    packed_linear = staticmethod(fp.packed_linear)
    # a whole Qwen2 forward in one call over packed weights (decoder.py): the model's no-grad fast path
    @staticmethod
    def decoder_forward(stack: fd.DecoderStack, **kwargs):
        # this module's attention threshold, read at call time, so one knob decides both paths' kernel
        return fd.decoder_forward(stack, **kwargs, parallel_attention_work=PARALLEL_ATTENTION_WORK)

    decoder_supports = staticmethod(fd.supports)

    @staticmethod
    def map(name: str) -> Callable[..., Tensor]:
        op = fk.UNARY[name]
        int_ok = name in operators.INT_CLOSED

        def _map(a: Tensor, out: Optional[Tensor] = None) -> Tensor:
            at = a._tensor
            if out is None:
                dt = at.dtype if (at.dtype == "float32" or int_ok) else "float32"
                out = new_tensor(a.backend, at.shape, dt)
            else:
                out = map_out(name, a, out)
            ot = out._tensor
            if ot.size == 0:
                return out
            if at.shape == ot.shape and ot.is_contiguous() and at.is_contiguous():
                fk.map_flat(op, ot.storage, at.storage, ot.size)
            else:
                sh, os_, as_ = _meta(ot.shape, ot.strides, broadcast_strides(at.shape, at.strides, ot.shape))
                fk.map_strided(op, ot.storage, sh, os_, at.storage, as_)
            return out

        return _map

    @staticmethod
    def zip(name: str) -> Callable[..., Tensor]:
        op = fk.BINARY[name]

        def _zip(a: Tensor, b: Tensor, out: Optional[Tensor] = None) -> Tensor:
            a, b, out = zip_prepare(name, a, b, out)
            at, bt, ot = a._tensor, b._tensor, out._tensor
            if ot.size == 0:
                return out
            if ot.is_contiguous() and at.is_contiguous() and bt.is_contiguous():
                if at.shape == bt.shape == ot.shape:
                    fk.zip_flat(op, ot.storage, at.storage, bt.storage, ot.size)
                    return out
                if bt.size == 1 and at.shape == ot.shape:       # tensor (op) scalar
                    fk.zip_flat_scalar(op, ot.storage, at.storage, bt.storage, ot.size, False)
                    return out
                if at.size == 1 and bt.shape == ot.shape:       # scalar (op) tensor
                    fk.zip_flat_scalar(op, ot.storage, bt.storage, at.storage, ot.size, True)
                    return out
            sh, os_, as_, bs = _meta(ot.shape, ot.strides, broadcast_strides(at.shape, at.strides, ot.shape),
                                     broadcast_strides(bt.shape, bt.strides, ot.shape))
            fk.zip_strided(op, ot.storage, sh, os_, at.storage, as_, bt.storage, bs)
            return out

        return _zip

    @staticmethod
    def where(c: Tensor, a: Tensor, b: Tensor, out: Optional[Tensor] = None) -> Tensor:
        a, b, out = where_prepare(c, a, b, out)
        ot, ct = out._tensor, c._tensor
        if ot.size == 0:
            return out
        at, bt = a._tensor, b._tensor
        sh, os_, cs, as_, bs = _meta(ot.shape, ot.strides, broadcast_strides(ct.shape, ct.strides, ot.shape),
                                     broadcast_strides(at.shape, at.strides, ot.shape),
                                     broadcast_strides(bt.shape, bt.strides, ot.shape))
        fk.where_strided(ot.storage, sh, os_, ct.storage, cs, at.storage, as_, bt.storage, bs)
        return out

    @staticmethod
    def reduce(name: str, start: float) -> Callable[[Tensor, int], Tensor]:
        op = fk.REDUCE[name]

        def _reduce(a: Tensor, dim: int) -> Tensor:
            at = a._tensor
            shape = list(at.shape)
            n = shape[dim]
            shape[dim] = 1
            out = new_tensor(a.backend, tuple(shape), at.dtype)
            ot = out._tensor
            if ot.size == 0:
                return out
            if n == 0:
                if name == "max":
                    raise MiniTorchError(f"max over an empty dim {dim} of shape {at.shape}")
                ot.storage.fill(start)
                return out
            osh = at.shape[:dim] + at.shape[dim + 1:]
            ost = at.strides[:dim] + at.strides[dim + 1:]
            fk.reduce_rows(op, ot.storage, at.storage, np.array(osh, _I64), np.array(ost, _I64), n, at.strides[dim])
            return out

        return _reduce

    @staticmethod
    def argmax(a: Tensor, dim: int) -> Tensor:
        at, n = a._tensor, a.shape[dim]
        out = argmax_out(a, dim)
        if out.size:
            osh = at.shape[:dim] + at.shape[dim + 1:]
            ost = at.strides[:dim] + at.strides[dim + 1:]
            fk.argmax_rows(out._tensor.storage, at.storage, np.array(osh, _I64), np.array(ost, _I64), n,
                           at.strides[dim])
        return out

    @staticmethod
    def matrix_multiply(a: Tensor, b: Tensor, out: Optional[Tensor] = None) -> Tensor:
        shape = matmul_shape(a, b)
        if out is None:
            out = new_tensor(a.backend, shape, a._tensor.dtype)
        elif out.shape != shape:
            raise MiniTorchError(f"matmul result shape {shape} does not match out of shape {out.shape}")
        else:
            check_writable(out)
        if out._tensor.size:
            an, bn, on = a.to_numpy(), b.to_numpy(), out.to_numpy()
            if fm.use_skinny(an, bn):
                # a (..., T, K) with few rows against a 2-D (out, in) weight: numba, one pass over b
                fm.skinny_matmul(an, bn, on)
            else:
                np.matmul(an, bn, out=on)
        return out

    # ---- fused ----
    @staticmethod
    def softmax(x: Tensor, dim: int) -> Tensor:
        return _last_dim(x, dim, lambda t: _softmax_last(t, False))

    @staticmethod
    def log_softmax(x: Tensor, dim: int) -> Tensor:
        return _last_dim(x, dim, lambda t: _softmax_last(t, True))

    @staticmethod
    def rmsnorm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
        x, w = _contig(x), _contig(weight)
        out = new_tensor(x.backend, x.shape, "float32")
        n = x.shape[-1]
        if out.size:
            ff.rmsnorm_rows(out._tensor.storage, x._tensor.storage, w._tensor.storage, x.size // n, n, float(eps))
        return out

    @staticmethod
    def layernorm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
        x, w, b = _contig(x), _contig(weight), _contig(bias)
        out = new_tensor(x.backend, x.shape, "float32")
        n = x.shape[-1]
        if out.size:
            ff.layernorm_rows(out._tensor.storage, x._tensor.storage, w._tensor.storage, b._tensor.storage,
                              x.size // n, n, float(eps))
        return out

    @staticmethod
    def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x = _contig(x)
        t_len, d = x.shape[-2], x.shape[-1]
        out = new_tensor(x.backend, x.shape, "float32")
        if out.size == 0:
            return out
        ct, st = cos._tensor, sin._tensor
        cst, csd = broadcast_strides(ct.shape[-2:], ct.strides[-2:], (t_len, d))
        sst, ssd = broadcast_strides(st.shape[-2:], st.strides[-2:], (t_len, d))
        ff.rope_rows(out._tensor.storage, x._tensor.storage, ct.storage, st.storage, cst, csd, sst, ssd,
                     x.size // (t_len * d), t_len, d)
        return out

    @staticmethod
    def embedding(weight: Tensor, ids: Tensor) -> Tensor:
        w, i = _contig(weight), _contig(ids)
        v, d = w.shape
        out = new_tensor(w.backend, ids.shape + (d,), w.dtype)
        bad = ff.embedding_rows(out._tensor.storage, w._tensor.storage, i._tensor.storage, i.size, v, d)
        if bad >= 0:
            raise MiniTorchError(f"embedding: id {int(i.to_numpy().reshape(-1)[bad])} out of range for "
                                 f"{v} rows (ids shape {ids.shape})")
        return out

    @staticmethod
    def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
        if gate.shape != up.shape:
            return TensorOps.silu_mul(gate, up)
        g, u = _contig(gate), _contig(up)
        out = new_tensor(g.backend, g.shape, "float32")
        ff.silu_mul_flat(out._tensor.storage, g._tensor.storage, u._tensor.storage, g.size)
        return out

    @staticmethod
    def attention(q: Tensor, k: Tensor, v: Tensor, scale: float, q_start: int) -> Tensor:
        b, hq, t, d = q.shape
        hkv, length = k.shape[1], k.shape[2]
        out = new_tensor(q.backend, q.shape, "float32")
        if out.size == 0:
            return out
        qt, kt, vt = q._tensor, k._tensor, v._tensor
        work = b * hq * t * length * d
        kernel = ff.attention_parallel if work >= PARALLEL_ATTENTION_WORK and b * hkv > 1 else ff.attention_serial
        kernel(out._tensor.storage, qt.storage, np.array(qt.strides, _I64), kt.storage,
                            np.array(kt.strides, _I64), vt.storage, np.array(vt.strides, _I64),
                            b, hq, hkv, t, d, length, np.float32(scale), int(q_start), ff.NO_MASK, 0)
        return out


def _softmax_last(x: Tensor, log: bool) -> Tensor:
    x = _contig(x)
    out = new_tensor(x.backend, x.shape, "float32")
    if out.size:
        n = x.shape[-1] if x.dims else 1
        ff.softmax_rows(out._tensor.storage, x._tensor.storage, x.size // n, n, log)
    return out


FastBackend = TensorBackend(FastOps, "FastBackend")
