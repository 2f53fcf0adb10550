"""Attention over the KV cache (decode, verify, prefill; GQA; contexts past 32k), KV-cache writes,
the fused QKV/rope/append step and cuBLAS GEMMs, against float64 numpy references. GPU only."""
from __future__ import annotations

import numpy as np
import pytest

from cuda_helpers import down, needs_gpu, ref_in, round_bf16, tol, up, use_broken_kernels

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
    from minitorch.cuda.launch import View, attention, empty

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


FAST_CASES = [c for c in CASES if c[4] in (64, 128)] + [
    (1, 14, 2, 16, 64, 290, 306),    # 0.5B-shaped 16-token verify: two row groups
    (1, 12, 2, 9, 128, 4990, 5000),  # 1.5B-shaped, more splits than a block takes at once
]


@pytest.mark.parametrize("kb", [32, 96])
@pytest.mark.parametrize("case", FAST_CASES, ids=[str(c) for c in FAST_CASES])
def test_attention_fast_kernel_equals_generic_bitwise(case, kb):
    """attn_partial_bf16_d64 / _d128 (compact code for the decoder's head sizes) write bit for bit what the
    generic attn_partial_bf16 writes (several chunks a split with kb 96), and match float64."""
    from minitorch.cuda.launch import View, attention, attn_partial_kernel, empty, ptr

    B, Hq, Hkv, T, D, q_start, L = case
    r = np.random.default_rng(hash(case) % 2**32 + 2)
    q = r.standard_normal((B, Hq, T, D)).astype(np.float32)
    max_len = L + 8  # a multiple of 8 more than L: rows stay 16-byte aligned; keys past L are never seen
    kbig = r.standard_normal((B, Hkv, max_len, D)).astype(np.float32)
    vbig = r.standard_normal((B, Hkv, max_len, D)).astype(np.float32)
    kb_, vb_ = up(kbig, "bfloat16"), up(vbig, "bfloat16")
    kv = View(kb_.storage, (B, Hkv, L, D), kb_.strides, "bfloat16")
    vv = View(vb_.storage, (B, Hkv, L, D), vb_.strides, "bfloat16")
    assert attn_partial_kernel("bf16", D, kv.strides, vv.strides, ptr(kv), ptr(vv)) == f"attn_partial_bf16_d{D}"
    outs = []
    for fast in (False, True):
        out = empty((B, Hq, T, D), "bfloat16")
        out.storage[...] = 0x7FC0  # poisoned: every element must be written
        attention(up(q, "bfloat16"), kv, vv, out, D ** -0.5, q_start, kb=kb, fast=fast)
        outs.append(out.storage.get())
    np.testing.assert_array_equal(outs[1], outs[0])
    want = attn_ref(ref_in(q, "bfloat16"), ref_in(kbig[:, :, :L], "bfloat16"), ref_in(vbig[:, :, :L], "bfloat16"),
                    D ** -0.5, q_start)
    np.testing.assert_allclose(down(out), want, **tol("bfloat16"))


def test_a_fast_kernel_dropping_each_chunks_last_key_fails(monkeypatch):
    """The bitwise comparison above catches attn_partial_bf16_d64 / _d128 skipping the last key of every chunk."""
    use_broken_kernels(monkeypatch, "attention_fast")
    for case in FAST_CASES[:2]:
        with pytest.raises(AssertionError):
            test_attention_fast_kernel_equals_generic_bitwise(case, 32)


def test_attention_rejects_short_cache():
    from minitorch.cuda.launch import attention, empty

    q = empty((1, 2, 3, 8), "float32")
    k = empty((1, 1, 4, 8), "float32")
    with pytest.raises(ValueError, match="cache holds 4 keys"):
        attention(q, k, k, empty((1, 2, 3, 8), "float32"), 1.0, 2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kv_append_and_fused_qkv_rope_append(dtype):
    import cupy as cp

    from minitorch.cuda.runtime import kernels

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
    from minitorch.cuda.blas import DTYPE_CODES, cublas
    from minitorch.cuda.launch import empty

    r = np.random.default_rng(M * N + K)
    x = r.standard_normal((M, K)).astype(np.float32)
    w = (r.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    xv, wv = up(x, "bfloat16"), up(w, "bfloat16")
    y = empty((M, N), out_dtype)
    cublas().linear(xv.storage.data.ptr, wv.storage.data.ptr, y.storage.data.ptr, M, N, K,
                    DTYPE_CODES["bfloat16"], DTYPE_CODES["bfloat16"], DTYPE_CODES[out_dtype])
    want = round_bf16(x).astype(np.float64) @ round_bf16(w).astype(np.float64).T
    np.testing.assert_allclose(down(y), want, rtol=2e-2, atol=2e-2)


def gemv_tmax(T):
    """The gemv instantiation (TMAX) the decoder picks for a T-token step (minitorch/cuda/decoder.py _gemv)."""
    return 1 if T == 1 else 4 if T <= 4 else 5 if T == 5 else 8 if T <= 8 else 16


def gemv_grid(tm, N):
    return ((N + 3) // 4 if tm <= 8 else (N + 1) // 2,)


def gemv_variants(T, N, r8=False):
    """(kernel name prefix, grid) of every instantiation the decoder may pick for T tokens: one-token
    plain and gate/up products (r8=True) also have an 8-rows-a-block variant (gemv1r8_*)."""
    tm = gemv_tmax(T)
    out = [(f"gemv{tm}", gemv_grid(tm, N))]
    if T == 1 and r8:
        out.append(("gemv1r8", ((N + 7) // 8,)))
    return out


@pytest.mark.parametrize("T", [1, 3, 5, 9, 16])
@pytest.mark.parametrize("N,K", [(1, 8), (37, 264), (1536, 1536), (515, 18944), (3000, 72)])
def test_gemv_bf16_all_outputs(T, N, K):
    import cupy as cp

    from minitorch.cuda.runtime import kernels

    r = np.random.default_rng(T * 1000 + N + K)
    x = r.standard_normal((T, K)).astype(np.float32)
    w = (r.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    xv, wv = up(x, "bfloat16"), up(w, "bfloat16")
    want = round_bf16(x).astype(np.float64) @ round_bf16(w).astype(np.float64).T
    z = np.uint64(0)
    yf = cp.full((T, N), np.nan, cp.float32)  # poisoned: every element must be written
    yb = cp.zeros((T, N), cp.uint16)
    resid = cp.asarray(np.ones((T, N), np.float32))
    dims = (np.int32(N), np.int32(K), np.int32(T), np.int32(K))
    head = (wv.storage, xv.storage, z, np.float32(0))
    from cuda_helpers import from_bf16_bits

    first = None
    for pre, grid in gemv_variants(T, N, r8=True):
        yf[...] = np.nan
        yb[...] = 0
        resid[...] = 1
        kernels().launch(f"{pre}_bf16", grid, (256,), head + (z, yf, z) + dims)
        kernels().launch(f"{pre}_bf16", grid, (256,), head + (yb, z, z) + dims)
        kernels().launch(f"{pre}_bf16", grid, (256,), head + (z, z, resid) + dims)
        np.testing.assert_allclose(yf.get(), want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(from_bf16_bits(yb.get()), want, rtol=1e-2, atol=1e-2)
        np.testing.assert_allclose(resid.get(), want + 1, rtol=1e-4, atol=1e-4)
        if first is None:
            first = yf.get()
        np.testing.assert_array_equal(yf.get(), first)  # rows a block never change a sum's order


@pytest.mark.parametrize("T", [1, 3, 5, 8, 16])
@pytest.mark.parametrize("I,K", [(1, 8), (333, 1000), (4480, 1536), (37, 2056)])
def test_gemv_gusilu_epilogue_equals_gemv_then_gate_up_silu(T, I, K):
    """gemv*_gusilu_bf16 (interleaved gate/up rows, SwiGLU in the epilogue) writes bit for bit what
    the plain GEMV's bf16 output followed by gate_up_silu_il_bf16 writes, and matches float64."""
    import cupy as cp

    from minitorch.cuda.runtime import kernels

    r = np.random.default_rng(100 * T + I)
    x = r.standard_normal((T, K)).astype(np.float32)
    wg = (r.standard_normal((I, K)) / np.sqrt(K)).astype(np.float32)
    wu = (r.standard_normal((I, K)) / np.sqrt(K)).astype(np.float32)
    wil = np.stack([wg, wu], axis=1).reshape(2 * I, K)  # rows gate 0, up 0, gate 1, up 1, ...
    xv, wv = up(x, "bfloat16"), up(wil, "bfloat16")
    tm, N, z = gemv_tmax(T), 2 * I, np.uint64(0)
    counter = cp.zeros(1, cp.uint32)
    act = cp.full((T, I), 0x7FC0, cp.uint16)  # poisoned with bf16 NaN
    dims = (np.int32(N), np.int32(K), np.int32(T), np.int32(K))
    kernels().launch(f"gemv{tm}_gusilu_bf16", gemv_grid(tm, N), (256,),
                     (wv.storage, xv.storage, z, np.float32(0), act, z, z) + dims + (counter,))
    gu = cp.zeros((T, N), cp.uint16)
    kernels().launch(f"gemv{tm}_bf16", gemv_grid(tm, N), (256,), (wv.storage, xv.storage, z, np.float32(0), gu, z, z) + dims)
    act2 = cp.full((T, I), 0x7FC0, cp.uint16)
    kernels().launch("gate_up_silu_il_bf16", (8,), (256,), (gu, act2, np.int64(T), np.int32(I)))
    np.testing.assert_array_equal(act.get(), act2.get())
    if T == 1:  # 8 rows a block (gemv1r8_gusilu_bf16): the same bits
        act8 = cp.full((T, I), 0x7FC0, cp.uint16)
        kernels().launch("gemv1r8_gusilu_bf16", ((N + 7) // 8,), (256,),
                         (wv.storage, xv.storage, z, np.float32(0), act8, z, z) + dims + (counter,))
        np.testing.assert_array_equal(act8.get(), act.get())
    from cuda_helpers import from_bf16_bits

    xr = round_bf16(x).astype(np.float64)
    g = round_bf16((xr @ round_bf16(wg).astype(np.float64).T).astype(np.float32)).astype(np.float64)
    u = round_bf16((xr @ round_bf16(wu).astype(np.float64).T).astype(np.float32)).astype(np.float64)
    np.testing.assert_allclose(from_bf16_bits(act.get()), g / (1 + np.exp(-g)) * u, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("T", [1, 3, 5, 8, 16])
@pytest.mark.parametrize("N,K", [(64, 96), (1536, 8960), (3584, 1000), (203, 264)])
def test_gemv_resnorm_epilogue(T, N, K):
    """gemv*_resnorm_bf16: resid += x @ W^T bit for bit as the plain resid GEMV, then the last block
    writes RMSNorm(resid) * nw like add_rmsnorm; the grid-wide ticket is back at 0 after each launch."""
    import cupy as cp

    from minitorch.cuda.launch import add_rmsnorm, empty, view_of
    from minitorch.cuda.runtime import kernels

    r = np.random.default_rng(7 * T + N + K)
    x = r.standard_normal((T, K)).astype(np.float32)
    w = (r.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    resid0 = (3 * r.standard_normal((T, N))).astype(np.float32)
    nw = (1 + 0.1 * r.standard_normal(N)).astype(np.float32)
    xv, wv, nwv = up(x, "bfloat16"), up(w, "bfloat16"), up(nw, "bfloat16")
    tm, z, eps = gemv_tmax(T), np.uint64(0), np.float32(1e-6)
    dims = (np.int32(N), np.int32(K), np.int32(T), np.int32(K))
    counter = cp.zeros(1, cp.uint32)
    plain = cp.asarray(resid0)
    kernels().launch(f"gemv{tm}_bf16", gemv_grid(tm, N), (256,), (wv.storage, xv.storage, z, eps, z, z, plain) + dims)
    for pre, grid in gemv_variants(T, N) * 2:  # twice: each launch relies on the last having reset the ticket
        resid = cp.asarray(resid0)
        xn = cp.full((T, N), 0x7FC0, cp.uint16)  # poisoned with bf16 NaN
        kernels().launch(f"{pre}_resnorm_bf16", grid, (256,),
                         (wv.storage, xv.storage, nwv.storage, eps, xn, z, resid) + dims + (counter,))
        assert int(counter.get()[0]) == 0
        np.testing.assert_array_equal(resid.get(), plain.get())
        ref = empty((T, N), "bfloat16")
        add_rmsnorm(view_of(cp.asarray(plain.get())), None, nwv, ref, float(eps))
        from cuda_helpers import from_bf16_bits

        got = from_bf16_bits(xn.get()).astype(np.float64)
        # same formula, another summation order of the sum of squares: equal up to one bf16 rounding step
        np.testing.assert_allclose(got, down(ref), rtol=1e-2, atol=1e-2)
        h = plain.get().astype(np.float64)
        want = round_bf16((h / np.sqrt((h ** 2).mean(-1, keepdims=True) + 1e-6)).astype(np.float32)) * round_bf16(nw)
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("T", [1, 4, 5, 9, 16])
@pytest.mark.parametrize("Hq,Hkv,D,bias", [(6, 2, 64, True), (4, 1, 128, False), (2, 2, 80, True)])
def test_gemv_qkvrope_epilogue_equals_gemv_then_rope_append(T, Hq, Hkv, D, bias):
    """gemv*_qkvrope_bf16 (QKV rows permuted within each head, rope + KV append in the epilogue) writes
    q and the caches bit for bit as the plain GEMV's bf16 product + qkv_rope_append_il_bf16 does, and
    the il kernel on permuted rows matches qkv_rope_append_bf16 on the original rows."""
    import cupy as cp

    from minitorch.cuda.runtime import kernels

    r = np.random.default_rng(T * 31 + D)
    H3, K, max_len, pos0, theta = Hq + 2 * Hkv, 264, 48, 20, 10000.0
    N = H3 * D
    x = r.standard_normal((T, K)).astype(np.float32)
    w = (r.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    b = r.standard_normal(N).astype(np.float32)
    perm = np.arange(N).reshape(H3, 2, D // 2).transpose(0, 2, 1).reshape(-1)  # new row -> old row
    xv, wpv = up(x, "bfloat16"), up(w[perm], "bfloat16")
    bpv = up(b[perm], "bfloat16").storage if bias else np.uint64(0)
    pos = cp.asarray(np.array([pos0], np.int32))
    tm = gemv_tmax(T)
    z, i32 = np.uint64(0), np.int32
    outs = []
    variants = [(True, pre, grid) for pre, grid in gemv_variants(T, N)] + [(False, None, None)]
    for fused, pre, grid in variants:
        q = cp.full((T, Hq, D), 0x7FC0, cp.uint16)
        kc = cp.full((Hkv, max_len, D), 0x7FC0, cp.uint16)
        vc = cp.full((Hkv, max_len, D), 0x7FC0, cp.uint16)
        tail = (bpv, q, kc, vc, pos, i32(Hq), i32(Hkv), i32(D), i32(max_len), np.float32(theta))
        if fused:
            kernels().launch(f"{pre}_qkvrope_bf16", grid, (256,),
                             (wpv.storage, xv.storage, i32(N), i32(K), i32(T)) + tail)
        else:
            qkv = cp.zeros((T, N), cp.uint16)
            kernels().launch(f"gemv{tm}_bf16", gemv_grid(tm, N), (256,), (wpv.storage, xv.storage, z, np.float32(0), qkv,
                                                                         z, z, i32(N), i32(K), i32(T), i32(K)))
            kernels().launch("qkv_rope_append_il_bf16", (T, H3), (max(32, D // 2),), (qkv,) + tail)
        outs.append([a.get() for a in (q, kc, vc)])
    for o in outs[1:]:
        for a, c in zip(outs[0], o):
            np.testing.assert_array_equal(a, c)
    q, kc, vc = outs[0]
    assert not np.isnan(from_bits(q)).any()
    assert not np.isnan(from_bits(kc[:, pos0:pos0 + T])).any() and not np.isnan(from_bits(vc[:, pos0:pos0 + T])).any()
    assert (kc[:, :pos0] == 0x7FC0).all() and (kc[:, pos0 + T:] == 0x7FC0).all()  # nothing else written
    # the original layout through the older kernel: same values up to FMA contraction (one bf16 step)
    qkv = up(round_bf16(round_bf16(x) @ round_bf16(w).T), "bfloat16")
    q2 = up(np.zeros((T, Hq, D), np.float32), "bfloat16")
    kc2 = up(np.zeros((Hkv, max_len, D), np.float32), "bfloat16")
    vc2 = up(np.zeros((Hkv, max_len, D), np.float32), "bfloat16")
    kernels().launch("qkv_rope_append_bf16", (T, H3), (max(32, D // 2),),
                     (qkv.storage, up(b, "bfloat16").storage if bias else z, q2.storage, kc2.storage, vc2.storage, pos,
                      i32(Hq), i32(Hkv), i32(D), i32(max_len), np.float32(theta)))
    np.testing.assert_allclose(from_bits(q), down(q2), rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(from_bits(kc[:, pos0:pos0 + T]), down(kc2)[:, pos0:pos0 + T], rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(from_bits(vc[:, pos0:pos0 + T]), down(vc2)[:, pos0:pos0 + T], rtol=2e-2, atol=2e-2)


def from_bits(a):
    from cuda_helpers import from_bf16_bits

    return from_bf16_bits(a).astype(np.float64)


@pytest.mark.parametrize("T", [1, 3, 5, 9])
@pytest.mark.parametrize("K", [264, 1536, 4104])
def test_gemv_norm_qkvrope_equals_add_rmsnorm_then_qkvrope(T, K):
    """gemv*_norm_qkvrope_bf16 (the QKV GEMV of models with hidden <= 2048) normalises the fp32 residual rows
    itself: the same results as add_rmsnorm followed by the qkvrope kernel up to the order of the sum of squares
    (one bf16 step of the normalised input)."""
    import cupy as cp

    from minitorch.cuda.launch import add_rmsnorm, empty, view_of
    from minitorch.cuda.runtime import kernels

    r = np.random.default_rng(50 * T + K)
    resid = (3 * r.standard_normal((T, K))).astype(np.float32)
    nw = (1 + 0.1 * r.standard_normal(K)).astype(np.float32)
    nwv = up(nw, "bfloat16")
    xn = empty((T, K), "bfloat16")
    add_rmsnorm(view_of(cp.asarray(resid)), None, nwv, xn, 1e-6)
    tm, z, eps, i32 = gemv_tmax(T), np.uint64(0), np.float32(1e-6), np.int32
    # QKV with rope + KV append
    Hq, Hkv, D, max_len, pos0 = 4, 2, 64, 40, 11
    N = (Hq + 2 * Hkv) * D
    wq = up((r.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32), "bfloat16")
    b = up(r.standard_normal(N).astype(np.float32), "bfloat16")
    pos = cp.asarray(np.array([pos0], np.int32))
    outs = []
    for norm in (True, False):
        q = cp.full((T, Hq, D), 0x7FC0, cp.uint16)
        kc = cp.full((Hkv, max_len, D), 0x7FC0, cp.uint16)
        vc = cp.full((Hkv, max_len, D), 0x7FC0, cp.uint16)
        tail = (b.storage, q, kc, vc, pos, i32(Hq), i32(Hkv), i32(D), i32(max_len), np.float32(10000.0))
        if norm:
            kernels().launch(f"gemv{tm}_norm_qkvrope_bf16", gemv_grid(tm, N), (256,),
                             (wq.storage, cp.asarray(resid), i32(N), i32(K), i32(T)) + tail + (nwv.storage, eps))
        else:
            kernels().launch(f"gemv{tm}_qkvrope_bf16", gemv_grid(tm, N), (256,),
                             (wq.storage, xn.storage, i32(N), i32(K), i32(T)) + tail)
        outs.append((from_bits(q.get()), from_bits(kc.get()[:, pos0:pos0 + T]), from_bits(vc.get()[:, pos0:pos0 + T])))
        assert (kc.get()[:, :pos0] == 0x7FC0).all()  # nothing else written
    for a, c in zip(*outs):
        assert not np.isnan(a).any()
        np.testing.assert_allclose(a, c, rtol=3e-2, atol=3e-2)
