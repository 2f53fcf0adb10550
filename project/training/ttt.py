"""Training-time test (EAGLE-3, Li et al. 2025, arXiv 2503.01840): a draft head run on its own outputs, as it drafts.

`forward_steps(head, feats, emb, K)` returns the head's outputs for K draft steps over whole teacher-forced
sequences. Step 1 is `head.forward`; step j >= 2 at position t reads (g^{(j-1)}_{t-1}, e_{t+1}), the previous
step's guess of f_t, and attends to step 1's keys at s <= t-j+1 (the verified context in the cache) plus step i's
key at position t-j+i for i = 2..j (the positions it drafted itself this round). Every step is labelled like
step 1 (f_{t+1}, p_{t+1}); objective.ttt_loss sums the steps' losses. Only training runs this: drafting
(minitorch/generation/head_drafter.py) reaches the same keys through the head's KV cache.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from minitorch import Tensor, from_numpy, nn, zeros
from minitorch.models.draft_head import DraftHead

TTT_MAX_STEPS = 4  # at most this many draft steps a training pass (project/train_draft_head.py keeps a copy)


def forward_steps(head: DraftHead, feats: Tensor, emb: Tensor, steps: int) -> list[Tensor]:
    """The head's outputs [g^(1), ..., g^(steps)], each (B, T, D), for whole teacher-forced sequences, as the head
    computes them when drafting:

        step 1   position t reads (f_t, e_{t+1}); causal attention over step 1's keys: `head.forward`, same bits
        step j   position t reads (g^(j-1)_{t-1}, e_{t+1}) (t = 0 has no g: it reads f_0 and is never scored)
                 and attends to step 1's keys/values at s <= t-j+1 and step i's at position t-j+i, i = 2..j

    Step j's output at t is the head's j-th draft after the verified context 0..t-j+1 (with the data's tokens
    standing in for the drafted ones); positions t < j-1 have no such context (objective.ttt_step_mask).
    Gradients flow through the g's into the earlier steps."""
    if not 1 <= steps <= TTT_MAX_STEPS:
        raise ValueError(f"steps must be in [1, {TTT_MAX_STEPS}], got {steps}")
    layer = head.layer
    b, t, _ = feats.shape
    cos, sin = head.rope(0, t)
    x = head.fc(nn.cat([feats, emb], -1))
    q, k, v = _qkv(layer, x, cos, sin)
    gs = [_finish(layer, x, nn.attention(q, k, v, layer.self_attn.scale, 0))]  # DecoderLayer.forward's ops
    ks, vs = [k], [v]
    for j in range(2, steps + 1):
        prev = gs[-1] if t == 1 else nn.cat([feats.narrow(1, 0, 1), gs[-1].narrow(1, 0, t - 1)], 1)
        x = head.fc(nn.cat([prev, emb], -1))
        q, k, v = _qkv(layer, x, cos, sin)
        ks.append(k)
        vs.append(v)
        gs.append(_finish(layer, x, ttt_attention(q, ks, vs, layer.self_attn.scale)))
    return gs


def _qkv(layer: Any, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The layer's attention inputs for x (B, T, D): q (B, Hq, T, hd), k, v (B, Hkv, T, hd), rope applied."""
    a = layer.self_attn
    b, t, _ = x.shape
    h = layer.input_layernorm(x)
    q = a.q_proj(h).view(b, t, a.n_heads, a.head_dim).permute(0, 2, 1, 3)
    k = a.k_proj(h).view(b, t, a.n_kv_heads, a.head_dim).permute(0, 2, 1, 3)
    v = a.v_proj(h).view(b, t, a.n_kv_heads, a.head_dim).permute(0, 2, 1, 3)
    return nn.rope(q, cos, sin), nn.rope(k, cos, sin), v


def _finish(layer: Any, x: Tensor, o: Tensor) -> Tensor:
    """The rest of the layer after attention o (B, Hq, T, hd): o_proj, residual, MLP, residual."""
    a = layer.self_attn
    b, t, _ = x.shape
    o = o.permute(0, 2, 1, 3).contiguous().view(b, t, a.n_heads * a.head_dim)
    h = x + a.o_proj(o)
    return h + layer.mlp(layer.post_attention_layernorm(h))


def ttt_attention(q: Tensor, ks: list[Tensor], vs: list[Tensor], scale: float) -> Tensor:
    """Step j = len(ks)'s attention (B, Hq, T, hd), from primitives: scores against step 1's keys (masked to
    s <= t-j+1) and against each later step i's key at t-j+i (one score a row), one softmax over all of them,
    the weighted sum of the matching values. kv heads are repeated for the query heads (GQA)."""
    j = len(ks)
    b, hq, t, hd = q.shape
    k1, v1 = _repeat_kv(ks[0], hq), _repeat_kv(vs[0], hq)
    mask = from_numpy(ttt_context_mask(t, j), backend=q.backend)  # (T, T) 1 = not visible
    scores = [((q @ k1.transpose(2, 3)) * scale).masked_fill(mask, -math.inf)]  # (B, Hq, T, T)
    diag_v = []
    for i in range(2, j + 1):
        d = j - i  # row t reads step i's key at position t - d
        ki, vi = _repeat_kv(_shift_rows(ks[i - 1], d), hq), _repeat_kv(_shift_rows(vs[i - 1], d), hq)
        s = (q * ki).sum(-1, keepdim=True) * scale  # (B, Hq, T, 1)
        if d:
            s = s.masked_fill(from_numpy(ttt_diagonal_mask(t, d), backend=q.backend), -math.inf)
        scores.append(s)
        diag_v.append(vi)
    p = nn.softmax(nn.cat(scores, -1), -1)  # (B, Hq, T, T + j - 1); the row max is subtracted inside
    o = p.narrow(3, 0, t) @ v1
    for n, vi in enumerate(diag_v):
        o = o + p.narrow(3, t + n, 1) * vi
    return o


def ttt_context_mask(t: int, step: int) -> np.ndarray:
    """(T, T) float32, 1 where step `step`'s query at position q may NOT read step 1's key at s (s > q-step+1):
    the verified context of its draft ends step-1 positions before it."""
    q, s = np.arange(t)[:, None], np.arange(t)[None, :]
    return (s > q - step + 1).astype(np.float32)


def ttt_diagonal_mask(t: int, shift: int) -> np.ndarray:
    """(T, 1) float32, 1 at rows q < shift: no key at position q - shift."""
    return (np.arange(t) < shift).astype(np.float32)[:, None]


def _shift_rows(z: Tensor, d: int) -> Tensor:
    """z (B, H, T, hd) moved d positions later: row t holds z's row t-d, rows t < d are zeros."""
    if d == 0:
        return z
    b, h, t, hd = z.shape
    pad = zeros((b, h, min(d, t), hd), backend=z.backend)
    return pad if d >= t else nn.cat([pad, z.narrow(2, 0, t - d)], 2)


def _repeat_kv(z: Tensor, hq: int) -> Tensor:
    """(B, Hkv, T, hd) -> (B, Hq, T, hd): query head h reads kv head h // (Hq / Hkv), as nn.attention does."""
    b, hkv, t, hd = z.shape
    if hkv == hq:
        return z
    return z.unsqueeze(2).expand(b, hkv, hq // hkv, t, hd).reshape(b, hq, t, hd)
