"""A Qwen2 decoder forward in one call on the CPU: the `decoder_forward` slot of FastBackend.

The module path (models/qwen2.py) runs a token through about 20 Tensor ops a layer, each one a Python
call through nn, the autodiff Function and the backend slot, with a new Tensor for its result: on the
1.5B target that framework work was 28 ms of a 108 ms decode step on a 2-core box (products 79 ms). This
function takes the same weights and runs the same kernels in the same order on plain numpy arrays:

    x = embed(ids)
    per layer:  n = rmsnorm(x);  q, k, v = n @ Wq^T + bq, ...;  rope(q), rope(k);  cache[start:start+T] = k, v
                o = attention(q, K, V) @ Wo^T;  h = x + o;  n = rmsnorm(h);  x = h + down(silu(gate(n)) * up(n))
    logits = rmsnorm(x[last_n]) @ head[:head_rows]^T

so its results are the module path's bit for bit (tests/test_cpu_decoder.py compares every output array);
it is only taken when every projection is a PackedWeight (the backend's packed kernel, float32 or int8
activations as fast_packed.set_activations says), activations are float32 and no gradient is recorded.
The model passes its Tensors and a KVCache; nothing here knows a checkpoint name.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from ..tensor_ops import DecoderStack
from . import fused as ff
from . import packed as fp

_I64 = np.int64


def _vec(t: Any) -> Optional[np.ndarray]:
    return None if t is None else t.to_numpy().reshape(-1)


def _linear(x: np.ndarray, w: Any, bias: Optional[np.ndarray] = None) -> np.ndarray:
    """x (R, K) @ w^T (+ bias) as nn.packed_linear computes it (the same slot, then one float32 add)."""
    out = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
    fp.packed_linear(x, w, out)
    if bias is not None:
        out += bias
    return out


def _linears(x: np.ndarray, ws: Sequence[Any], biases: Sequence[Optional[np.ndarray]],
             joined: Optional[tuple]) -> list[np.ndarray]:
    """[x @ w^T (+ b) for w, b in zip(ws, biases)]; with joined = (weight, n) the first n in one product with that
    weight (their rows one after another: PackedWeight.concat), its columns split. In the row kernel (at most
    packed.MAX_ROWS rows) one product computes each output row as the separate ones do, and the bias add is the same
    float32 add, so the results are the same bits. More rows go to BLAS, which picks its kernels by the product's
    shape, so a wider product may sum in another order (OpenBLAS on a Zen 3 box: a 40-row prefill's q differed by
    1e-5 in the joined q/k/v product): there the products stay separate, as the op-by-op model computes them."""
    outs: list[np.ndarray] = []
    if joined is not None and x.shape[0] > fp.MAX_ROWS:
        joined = None
    if joined is not None:
        fused, n = joined
        bs = biases[:n]
        bias = None if all(b is None for b in bs) else np.concatenate(
            [np.zeros(w.shape[0], np.float32) if b is None else b for w, b in zip(ws[:n], bs)])
        y = _linear(x, fused, bias)
        start = 0
        for w in ws[:n]:
            outs.append(y[:, start:start + w.shape[0]])
            start += w.shape[0]
        ws, biases = ws[n:], biases[n:]
    return outs + [_linear(x, w, b) for w, b in zip(ws, biases)]


def _rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    out = np.empty_like(x)
    n = x.shape[-1]
    ff.rmsnorm_rows(out.reshape(-1), x.reshape(-1), w, x.size // n, n, float(eps))
    return out


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x (H, T, D) contiguous; cos/sin (T, D) contiguous rows of the tables."""
    h, t, d = x.shape
    out = np.empty_like(x)
    ff.rope_rows(out.reshape(-1), x.reshape(-1), cos.reshape(-1), sin.reshape(-1), d, 1, d, 1, h, t, d)
    return out


def supports(stack: DecoderStack) -> bool:
    """Whether every projection is a PackedWeight this backend's kernel takes (else the module path)."""
    from ..packed import PackedWeight

    return isinstance(stack.head, PackedWeight) and all(
        isinstance(w, PackedWeight) for lw in stack.layers for w in (lw.q, lw.k, lw.v, lw.o, lw.gate, lw.up, lw.down))


def decoder_forward(stack: DecoderStack, *, parallel_attention_work: int, ids: Optional[np.ndarray] = None,
                    cache: Any = None, last_n: Optional[int] = None, return_hidden: bool = False,
                    x0: Optional[np.ndarray] = None, tree: Any = None,
                    kv_only: bool = False) -> tuple[Optional[np.ndarray], Optional[np.ndarray]]:
    """logits (T or last_n, head rows) for ids (T,) continuing cache (advanced by T), and with return_hidden the
    final-norm hidden states of all T positions (before last_n), as the model's forward returns them.
    parallel_attention_work: the attention work from which the threaded kernel runs (ops.PARALLEL_ATTENTION_WORK).
    x0 (T, D) float32: the first layer's input instead of embed(ids) (a draft head's fc output; ids and
    stack.embed are then unused, and may be None); stack.norm None: no final norm, the hidden states are the last
    layer's output (a draft head's g). tree (a models/tree_step.py TreeStep): row t at position positions[t], seeing
    the cache's slots below mask_from and those mask_from + j where mask[t, j]; the K/V rows are written at slots
    length .. length + T - 1 all the same.
    kv_only (a cache needed): positions whose outputs nobody reads, only their K/V wanted (a draft head reading the
    prompt): the last layer stops once its k and v are in the cache (no q, attention, MLP or logits); returns (None,
    None). Its k and v products are the same bits as the joined q/k/v product's (_linears)."""
    from ..packed import PackedWeight

    embed, norm, head, eps = stack.embed, stack.norm, stack.head, stack.eps
    if (ids is None) == (x0 is None):
        raise ValueError("decoder_forward takes exactly one of ids and x0")
    if kv_only and cache is None:
        raise ValueError("decoder_forward(kv_only=True) writes K/V into a cache: pass one")
    t = int(ids.shape[0]) if x0 is None else int(x0.shape[0])
    start = cache.length if cache is not None else 0
    if x0 is not None:
        x = np.ascontiguousarray(x0, dtype=np.float32)
    elif isinstance(embed, PackedWeight):
        x = embed.rows(ids)
    else:
        w = embed.to_numpy()
        x = np.empty((t, w.shape[1]), dtype=np.float32)
        bad = ff.embedding_rows(x.reshape(-1), w.reshape(-1), ids, t, w.shape[0], w.shape[1])
        if bad >= 0:
            raise ValueError(f"embedding: id {int(ids[bad])} out of range for {w.shape[0]} rows")
    if tree is not None and (tree.positions.shape != (t,) or tree.mask.shape != (t, start + t - tree.mask_from)):
        raise ValueError(f"a tree step of {t} rows after {start} cached needs positions ({t},) and a mask "
                         f"({t}, {start + t - tree.mask_from}), got {tree.positions.shape}, {tree.mask.shape}")
    if tree is None or tree.causal(start):  # a chain-shaped tree (a chain round, a plain step) is a causal step
        cos = np.ascontiguousarray(stack.cos_table.to_numpy()[start:start + t])
        sin = np.ascontiguousarray(stack.sin_table.to_numpy()[start:start + t])
        mask, mask_from = ff.NO_MASK, 0
    else:
        mask, mask_from = tree.mask, int(tree.mask_from)
        cos = np.ascontiguousarray(stack.cos_table.to_numpy()[tree.positions])
        sin = np.ascontiguousarray(stack.sin_table.to_numpy()[tree.positions])
    hd, hq, hkv = stack.head_dim, stack.n_heads, stack.n_kv_heads
    scale = np.float32(hd ** -0.5)
    for i, lw in enumerate(stack.layers):
        n = _rmsnorm(x, _vec(lw.input_norm), eps)
        kv_last = kv_only and i == len(stack.layers) - 1
        if kv_last:  # only what the cache keeps
            k, v = _linears(n, (lw.k, lw.v), (_vec(lw.k_bias), _vec(lw.v_bias)), None)
        else:
            q, k, v = _linears(n, (lw.q, lw.k, lw.v), (_vec(lw.q_bias), _vec(lw.k_bias), _vec(lw.v_bias)), lw.qkv)
            q = _rope(np.ascontiguousarray(q.reshape(t, hq, hd).transpose(1, 0, 2)), cos, sin)
        k = _rope(np.ascontiguousarray(k.reshape(t, hkv, hd).transpose(1, 0, 2)), cos, sin)
        v = v.reshape(t, hkv, hd).transpose(1, 0, 2)
        if cache is not None:
            kc, vc = cache.keys[i].to_numpy()[0], cache.values[i].to_numpy()[0]  # (Hkv, max_len, D), contiguous
            kc[:, start:start + t] = k
            vc[:, start:start + t] = v
            length = start + t
        else:
            kc, vc, length = k, np.ascontiguousarray(v), t
        if kv_last:
            break
        o = np.empty((hq, t, hd), dtype=np.float32)
        kernel = ff.attention_parallel if hq * t * length * hd >= parallel_attention_work and hkv > 1 \
            else ff.attention_serial
        ks = np.array((0,) + tuple(s // 4 for s in kc.strides), _I64)
        vs = np.array((0,) + tuple(s // 4 for s in vc.strides), _I64)
        qs = np.array((q.size, t * hd, hd, 1), _I64)
        kernel(o.reshape(-1), q.reshape(-1), qs, kc.reshape(-1), ks, vc.reshape(-1), vs, 1, hq, hkv, t, hd, length, scale,
               int(start), mask, mask_from)
        h = x + _linear(np.ascontiguousarray(o.transpose(1, 0, 2)).reshape(t, hq * hd), lw.o)
        n = _rmsnorm(h, _vec(lw.post_norm), eps)
        g, u = (np.ascontiguousarray(y) for y in _linears(n, (lw.gate, lw.up), (None, None), lw.gate_up))
        a = np.empty_like(g)
        ff.silu_mul_flat(a.reshape(-1), g.reshape(-1), u.reshape(-1), g.size)
        x = h + _linear(a, lw.down)
    if cache is not None:
        cache.advance(t)
    if kv_only:
        return None, None
    hidden = None
    nw = _vec(norm)
    if nw is None:  # a draft head: its layer's output is both the hidden state and what the LM head reads
        hidden = x if return_hidden else None
        h = x if last_n is None else np.ascontiguousarray(x[t - last_n:])
    elif return_hidden:
        hidden = _rmsnorm(x, nw, eps)
        h = hidden if last_n is None else hidden[t - last_n:]
    else:
        h = _rmsnorm(x if last_n is None else np.ascontiguousarray(x[t - last_n:]), nw, eps)
    return _linear(np.ascontiguousarray(h), head), hidden

