"""A numpy float64 Qwen2 forward that rounds to bf16 where the CUDA decoder stores bf16 (minitorch/cuda/decoder.py):
the simulation behind the GPU decoder's tolerance (tests/test_cuda_model.py, tests/test_bf16_tolerance.py).

Every buffer the decoder keeps in bf16 is rounded here, at its most rounded path (the cuBLAS / prefill one,
where every product is stored in bf16 before the next kernel reads it): the normalised input of every
projection (xn), the q/k/v products and the q/k/v after bias and rope (KV cache), the attention output, the
o and down products (the bf16 delta added to the fp32 residual), gate and up products and their SwiGLU
product. The residual stream, attention scores and softmax and the logits stay in fp32 / float64 as on the
device. With round=None it is the plain float64 model (the reference). products=False leaves the products
unrounded (our GEMV's path: bias, rope and SwiGLU applied in fp32 before the one rounding of the output; the
o and down products added to the residual in fp32). The dict also returns layer 0's K cache (k0, (T, Hkv, D))
and its accumulation magnitudes (k0_acc: |xn| @ |W_k|^T + |bias|, summed over each rope pair).

`bugs`: "down_scale" multiplies the last layer's down projection by 1.05; "no_k_bias" drops the k-projection
bias of every layer: the two model bugs a GPU tolerance must not hide (issue #16).
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np


def round_bf16_f64(x: np.ndarray) -> np.ndarray:
    """Round to the nearest bf16 value (ties to even), returned as float64 (via float32, as the device)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x, pos, theta):  # x (T, heads, D), rotate_half convention
    D = x.shape[-1]
    inv = theta ** (-np.arange(0, D, 2, dtype=np.float64) / D)
    ang = np.asarray(pos, np.float64)[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, -1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, -1)[:, None, :]
    rot = np.concatenate([-x[..., D // 2:], x[..., :D // 2]], -1)
    return x * cos + rot * sin


def forward(cfg: dict, w: dict, ids: list[int], round: Optional[Callable] = None, bugs: tuple = (),
            eps: float = 1e-6, products: bool = True, only: Optional[set] = None) -> tuple[np.ndarray, list[np.ndarray]]:
    """Logits (T, V) of a causal forward over ids from position 0, and a dict: xn (T, H) the final normalised
    hidden states, head (V, H) the LM head, resid (T, H) the final residual stream (before the final norm),
    resid_acc (T, H) the sum of the magnitudes of everything added into each residual element (|embedding| +
    sum over layers of |attn| @ |W_o|^T + |act| @ |W_down|^T): the accumulation a rounding error scales with.
    only: round just these buffers ("xn", "q", "kv_pre" (k before rope), "k", "v", "att", "act", "xn_final";
    default all of them; {"k", "v", "xn_final"} was the retired persistent step, kernels/NOTES.md)."""
    r0 = round or (lambda x: x)

    def r(x: np.ndarray, name: str = "") -> np.ndarray:
        return r0(x) if only is None or name in only else x

    rp = r if products else (lambda x: x)  # products: the cuBLAS path stores each product in bf16 first
    H, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    Hq, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = H // Hq
    theta = cfg.get("rope_theta", 10000.0)
    W = {k: np.asarray(v, np.float64) for k, v in w.items()}
    T = len(ids)
    pos = np.arange(T)
    x = W["model.embed_tokens.weight"][ids]
    acc = np.abs(x)  # accumulation magnitude of each residual element: sum of |terms| added into it
    for li in range(L):
        p = f"model.layers.{li}."
        a = p + "self_attn."
        xn = r(_rms(x, W[p + "input_layernorm.weight"], eps), "xn")
        kb = np.zeros(Hkv * D) if "no_k_bias" in bugs else W[a + "k_proj.bias"]
        q = r(rp(xn @ W[a + "q_proj.weight"].T) + W[a + "q_proj.bias"], "q").reshape(T, Hq, D)
        k = r(rp(xn @ W[a + "k_proj.weight"].T) + kb, "kv_pre").reshape(T, Hkv, D)
        v = r(rp(xn @ W[a + "v_proj.weight"].T) + W[a + "v_proj.bias"], "v").reshape(T, Hkv, D)
        q, k = r(_rope(q, pos, theta), "q"), r(_rope(k, pos, theta), "k")
        if li == 0:  # layer 0's K cache and the accumulation magnitude of each entry (rope mixes pairs)
            k_acc = (np.abs(xn) @ np.abs(W[a + "k_proj.weight"]).T + np.abs(kb)).reshape(T, Hkv, D)
            k_acc = k_acc + np.concatenate([k_acc[..., D // 2:], k_acc[..., :D // 2]], -1)
            k0, k0_acc = k.copy(), k_acc
        rep = Hq // Hkv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = np.einsum("thd,shd->hts", q, k) * D ** -0.5
        s = s + np.triu(np.full((T, T), -np.inf), 1)[None]
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        att = r(np.einsum("hts,shd->thd", s, v).reshape(T, Hq * D), "att")
        x = x + rp(att @ W[a + "o_proj.weight"].T)
        acc = acc + np.abs(att) @ np.abs(W[a + "o_proj.weight"]).T
        xn = r(_rms(x, W[p + "post_attention_layernorm.weight"], eps), "xn")
        g = rp(xn @ W[p + "mlp.gate_proj.weight"].T)
        u = rp(xn @ W[p + "mlp.up_proj.weight"].T)
        act = r(g / (1.0 + np.exp(-g)) * u, "act")
        down = W[p + "mlp.down_proj.weight"] * (1.05 if "down_scale" in bugs and li == L - 1 else 1.0)
        x = x + rp(act @ down.T)
        acc = acc + np.abs(act) @ np.abs(down).T
    xn = r(_rms(x, W["model.norm.weight"], eps), "xn_final")
    head = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") or "lm_head.weight" not in W \
        else W["lm_head.weight"]
    return xn @ head.T, dict(xn=xn, head=head, resid=x, resid_acc=acc, k0=k0, k0_acc=k0_acc)
