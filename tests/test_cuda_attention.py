"""Attention over the KV cache (decode, verify, prefill; GQA; contexts past 32k), KV-cache writes,
the fused QKV/rope/append step and cuBLAS GEMMs, against float64 numpy references. GPU only."""
from __future__ import annotations

import numpy as np
import pytest

from cuda_helpers import down, needs_gpu, ref_in, round_bf16, tol, up

pytestmark = [pytest.mark.gpu, needs_gpu]


def attn_ref(q, k, v, scale, q_start):
    """q (B,Hq,T,D), k/v (B,Hkv,L,D) float64; causal with queries at q_start + t."""
    B, Hq, T, D = q.shape
    G = Hq // k.shape[1]
    k = np.repeat(k, G, axis=1)
    v = np.repeat(v, G, axis=1)
    s = np.einsum("bhtd,bhld->bhtl", q, k) * scale
    L = k.shape[2]
    pos = q_start + np.arange(T)[:, None]
    s = np.where(np.arange(L)[None, :] <= pos, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhtl,bhld->bhtd", p, v)


CASES = [  # B, Hq, Hkv, T, D, q_start, L
    (1, 1, 1, 1, 64, 0, 1),
    (1, 4, 4, 1, 64, 16, 17),
    (1, 28, 4, 1, 128, 383, 384),     # 7B decode
    (1, 12, 2, 5, 128, 200, 300),     # 1.5B verify, gamma = 4, cache longer than needed
    (1, 28, 4, 9, 128, 1000, 1009),   # 7B verify, gamma = 8
    (2, 6, 3, 37, 80, 0, 37),         # prefill, odd head dim, batch 2
    (1, 8, 1, 3, 256, 70, 100),       # largest head dim
    (1, 14, 2, 1, 64, 33000, 33001),  # long context decode
    (1, 7, 1, 4, 128, 32768, 32772),  # long context verify
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_attention(case, dtype):
    from minitorch.cuda_launch import View, attention, empty

    B, Hq, Hkv, T, D, q_start, L = case
    r = np.random.default_rng(hash(case) % 2**32)
    q = r.standard_normal((B, Hq, T, D)).astype(np.float32)
    k = r.standard_normal((B, Hkv, L, D)).astype(np.float32)
    v = r.standard_normal((B, Hkv, L, D)).astype(np.float32)
    scale = D ** -0.5
    # the cache lives inside a bigger buffer (max_len > L), read through a strided view
    max_len = L + 5
    kbig = np.zeros((B, Hkv, max_len, D), np.float32)
    vbig = np.zeros_like(kbig)
    kbig[:, :, :L], vbig[:, :, :L] = k, v
    kb, vb = up(kbig, dtype), up(vbig, dtype)
    kv = View(kb.storage, (B, Hkv, L, D), kb.strides, dtype)
    vv = View(vb.storage, (B, Hkv, L, D), vb.strides, dtype)
    out = empty((B, Hq, T, D), dtype)
    attention(up(q, dtype), kv, vv, out, scale, q_start)
    want = attn_ref(ref_in(q, dtype), ref_in(k, dtype), ref_in(v, dtype), scale, q_start)
    t = tol(dtype) if dtype == "bfloat16" else dict(rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(down(out), want, **t)


def test_attention_rejects_short_cache():
    from minitorch.cuda_launch import attention, empty

    q = empty((1, 2, 3, 8), "float32")
    k = empty((1, 1, 4, 8), "float32")
    with pytest.raises(ValueError, match="cache holds 4 keys"):
        attention(q, k, k, empty((1, 2, 3, 8), "float32"), 1.0, 2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kv_append_and_fused_qkv_rope_append(dtype):
    import cupy as cp

    from minitorch.cuda_runtime import kernels

    r = np.random.default_rng(5)
    Hq, Hkv, D, T, max_len, pos0, theta = 6, 2, 64, 3, 40, 17, 10000.0
    H3 = Hq + 2 * Hkv
    qkv = r.standard_normal((T, H3 * D)).astype(np.float32)
    bias = r.standard_normal(H3 * D).astype(np.float32)
    qkv_v, bias_v = up(qkv, dtype), up(bias, dtype)
    q_out = up(np.zeros((T, Hq, D), np.float32), dtype)
    kc = up(np.zeros((Hkv, max_len, D), np.float32), dtype)
    vc = up(np.zeros((Hkv, max_len, D), np.float32), dtype)
    pos = cp.asarray(np.array([pos0], np.int32))
    sfx = "f32" if dtype == "float32" else "bf16"
    kernels().launch(f"qkv_rope_append_{sfx}", (T, H3), (D // 2,),
                     (qkv_v.storage, bias_v.storage, q_out.storage, kc.storage, vc.storage, pos,
                      np.int32(Hq), np.int32(Hkv), np.int32(D), np.int32(max_len), np.float32(theta)))
    x = (ref_in(qkv, dtype) + ref_in(bias, dtype)).reshape(T, H3, D)
    inv_freq = 1.0 / theta ** (np.arange(0, D, 2) / D)
    ang = (pos0 + np.arange(T))[:, None] * inv_freq[None]
    cos = np.cos(np.concatenate([ang, ang], -1))[:, None]
    sin = np.sin(np.concatenate([ang, ang], -1))[:, None]
    half = D // 2
    rot = lambda y: np.concatenate([-y[..., half:], y[..., :half]], -1)  # noqa: E731
    qr = x[:, :Hq] * cos + rot(x[:, :Hq]) * sin
    kr = x[:, Hq:Hq + Hkv] * cos + rot(x[:, Hq:Hq + Hkv]) * sin
    t = tol(dtype) if dtype == "bfloat16" else dict(rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(down(q_out), qr, **t)
    got_k, got_v = down(kc), down(vc)
    np.testing.assert_allclose(got_k[:, pos0:pos0 + T], kr.transpose(1, 0, 2), **t)
    np.testing.assert_allclose(got_v[:, pos0:pos0 + T], x[:, Hq + Hkv:].transpose(1, 0, 2), **t)
    assert (got_k[:, :pos0] == 0).all() and (got_k[:, pos0 + T:] == 0).all()
    # plain append with a host position
    k_new = r.standard_normal((1, Hkv, T, D)).astype(np.float32)
    kernels().launch(f"kv_append_{sfx}", (4,), (256,),
                     (up(k_new, dtype).storage, up(k_new, dtype).storage, kc.storage, vc.storage, np.uint64(0),
                      np.int32(3), np.int32(Hkv), np.int32(T), np.int32(D), np.int32(max_len)))
    np.testing.assert_allclose(down(kc)[:, 3:3 + T], ref_in(k_new, dtype)[0], rtol=0, atol=0)


@pytest.mark.parametrize("M,N,K", [(1, 7, 5), (1, 3584, 3584), (5, 1000, 129), (128, 512, 1536)])
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
def test_cublas_linear_bf16(M, N, K, out_dtype):
    from minitorch.cuda_blas import DTYPE_CODES, cublas
    from minitorch.cuda_launch import empty

    r = np.random.default_rng(M * N + K)
    x = r.standard_normal((M, K)).astype(np.float32)
    w = (r.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    xv, wv = up(x, "bfloat16"), up(w, "bfloat16")
    y = empty((M, N), out_dtype)
    cublas().linear(xv.storage.data.ptr, wv.storage.data.ptr, y.storage.data.ptr, M, N, K,
                    DTYPE_CODES["bfloat16"], DTYPE_CODES["bfloat16"], DTYPE_CODES[out_dtype])
    want = round_bf16(x).astype(np.float64) @ round_bf16(w).astype(np.float64).T
    np.testing.assert_allclose(down(y), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("T", [1, 3, 5, 9, 16])
@pytest.mark.parametrize("N,K", [(1, 8), (37, 264), (1536, 1536), (515, 18944), (3000, 72)])
def test_gemv_bf16_all_outputs(T, N, K):
    import cupy as cp

    from minitorch.cuda_runtime import kernels

    r = np.random.default_rng(T * 1000 + N + K)
    x = r.standard_normal((T, K)).astype(np.float32)
    w = (r.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    xv, wv = up(x, "bfloat16"), up(w, "bfloat16")
    want = round_bf16(x).astype(np.float64) @ round_bf16(w).astype(np.float64).T
    tm = 1 if T == 1 else 4 if T <= 4 else 8 if T <= 8 else 16
    z = np.uint64(0)
    yf = cp.full((T, N), np.nan, cp.float32)  # poisoned: every element must be written
    yb = cp.zeros((T, N), cp.uint16)
    resid = cp.asarray(np.ones((T, N), np.float32))
    grid = ((N + 3) // 4 if tm <= 8 else (N + 1) // 2,)
    dims = (np.int32(N), np.int32(K), np.int32(T), np.int32(K))
    head = (wv.storage, xv.storage, z, np.float32(0))
    kernels().launch(f"gemv{tm}_bf16", grid, (256,), head + (z, yf, z) + dims)
    kernels().launch(f"gemv{tm}_bf16", grid, (256,), head + (yb, z, z) + dims)
    kernels().launch(f"gemv{tm}_bf16", grid, (256,), head + (z, z, resid) + dims)
    np.testing.assert_allclose(yf.get(), want, rtol=1e-4, atol=1e-4)
    from cuda_helpers import from_bf16_bits

    np.testing.assert_allclose(from_bf16_bits(yb.get()), want, rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(resid.get(), want + 1, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("T", [1, 5, 16])
def test_gemv_silu_fused_down_projection(T):
    import cupy as cp

    from minitorch.cuda_runtime import kernels

    r = np.random.default_rng(T)
    N, K = 333, 1000
    gu = r.standard_normal((T, 2 * K)).astype(np.float32)
    w = (r.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    g, u = round_bf16(gu[:, :K]).astype(np.float64), round_bf16(gu[:, K:]).astype(np.float64)
    act = round_bf16((g / (1 + np.exp(-g)) * u).astype(np.float32))  # the kernel rounds silu(g) * u to bf16
    want = act.astype(np.float64) @ round_bf16(w).astype(np.float64).T
    tm = 1 if T == 1 else 8 if T <= 8 else 16
    yf = cp.full((T, N), np.nan, cp.float32)
    z = np.uint64(0)
    kernels().launch(f"gemv{tm}_silu_bf16", ((N + 3) // 4 if tm <= 8 else (N + 1) // 2,), (256,),
                     (up(w, "bfloat16").storage, up(gu, "bfloat16").storage, z, np.float32(0), z, yf, z,
                      np.int32(N), np.int32(K), np.int32(T), np.int32(2 * K)))
    np.testing.assert_allclose(yf.get(), want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("T", [1, 3, 8, 16])
def test_gemv_norm_fused_projection_equals_add_rmsnorm_then_gemv(T):
    import cupy as cp

    from minitorch.cuda_launch import add_rmsnorm, empty, view_of
    from minitorch.cuda_runtime import kernels

    r = np.random.default_rng(10 + T)
    N, K = 203, 1536
    resid = (3 * r.standard_normal((T, K))).astype(np.float32)
    nw = (1 + 0.1 * r.standard_normal(K)).astype(np.float32)
    w = (r.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    wv, nwv = up(w, "bfloat16"), up(nw, "bfloat16")
    z = np.uint64(0)
    tm = 1 if T == 1 else 4 if T <= 4 else 8 if T <= 8 else 16
    grid = ((N + 3) // 4 if tm <= 8 else (N + 1) // 2,)
    fused = cp.full((T, N), np.nan, cp.float32)
    kernels().launch(f"gemv{tm}_norm_bf16", grid, (256,),
                     (wv.storage, cp.asarray(resid), nwv.storage, np.float32(1e-6), z, fused, z, np.int32(N),
                      np.int32(K), np.int32(T), np.int32(K)))
    xn = empty((T, K), "bfloat16")
    add_rmsnorm(view_of(cp.asarray(resid)), None, nwv, xn, 1e-6)
    plain = cp.full((T, N), np.nan, cp.float32)
    kernels().launch(f"gemv{tm}_bf16", grid, (256,), (wv.storage, xn.storage, z, np.float32(0), z, plain, z,
                                                       np.int32(N), np.int32(K), np.int32(T), np.int32(K)))
    np.testing.assert_allclose(fused.get(), plain.get(), rtol=2e-3, atol=2e-3)  # same bf16 inputs up to rounding ties
    h = resid.astype(np.float64)
    xr = round_bf16((h / np.sqrt((h ** 2).mean(-1, keepdims=True) + 1e-6)).astype(np.float32)) * round_bf16(nw)
    np.testing.assert_allclose(fused.get(), round_bf16(xr.astype(np.float32)) @ round_bf16(w).T, rtol=2e-2, atol=2e-2)
