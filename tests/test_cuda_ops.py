"""The CUDA TensorBackend against FastBackend through the public Tensor API: generic ops on
permuted / broadcast inputs, matmul layouts (transposed views, batch broadcast), every fused slot,
bf16 storage, copy_ into strided KV-cache views, and the NVRTC fallback. GPU only."""
from __future__ import annotations

import numpy as np
import pytest

import minitorch
from minitorch import FastBackend, nn
from cuda_helpers import needs_gpu, round_bf16

pytestmark = [pytest.mark.gpu, needs_gpu]


@pytest.fixture(scope="module")
def cuda():
    from minitorch.cuda.ops import make_cuda_backend

    return make_cuda_backend()


def pair(arr, cuda, perm=None):
    """The same values on FastBackend and CUDA, optionally stored permuted (non-contiguous)."""
    out = []
    for be in (FastBackend, cuda):
        if perm is None or arr.ndim < 2:
            out.append(minitorch.from_numpy(np.ascontiguousarray(arr), backend=be))
        else:
            base = minitorch.from_numpy(np.ascontiguousarray(arr.transpose(perm)), backend=be)
            out.append(base.permute(*[int(i) for i in np.argsort(perm)]))
    return out


def close(a, b, rtol=1e-5, atol=1e-5):
    np.testing.assert_allclose(np.asarray(b.to_numpy(), np.float64), np.asarray(a.to_numpy(), np.float64),
                               rtol=rtol, atol=atol)


def test_generic_ops_match_fast_backend(cuda):
    r = np.random.default_rng(0)
    for shape, perm in [((3, 4), (1, 0)), ((2, 3, 5), (2, 0, 1)), ((1, 7, 1, 3), (3, 1, 2, 0)), ((129,), None)]:
        x = r.standard_normal(shape).astype(np.float32)
        y = r.standard_normal(shape[-1:]).astype(np.float32)
        (xf, xc), (yf, yc) = pair(x, cuda, perm), pair(y, cuda)
        with minitorch.no_grad():
            for f in (lambda a, b: a + b, lambda a, b: a * b - b, lambda a, b: a / (b * b + 1),
                      lambda a, b: (a < b) + (a == a) * 2 + (a > b), lambda a, b: (a.exp() + 1.0).log(),
                      lambda a, b: a.sigmoid() + a.relu() + a.silu() + a.tanh() - (a * a + 1.0).sqrt().rsqrt(),
                      lambda a, b: minitorch.where(a > 0, a, b), lambda a, b: a.masked_fill(a > 0.5, -1e9),
                      lambda a, b: a ** 2.0 + 3.0 - a * 0.5):
                close(f(xf, yf), f(xc, yc))
            for d in range(len(shape)):
                close(xf.sum(d), xc.sum(d), 1e-5, 1e-4)
                close(xf.max(d), xc.max(d))
                close(xf.mean(d, keepdim=True), xc.mean(d, keepdim=True), 1e-5, 1e-5)
                np.testing.assert_array_equal(xf.argmax(d).to_numpy(), xc.argmax(d).to_numpy())
            close(xf.sum(), xc.sum(), 1e-5, 1e-4)
            i = minitorch.tensor([3, -2, 7], dtype="int64", backend=cuda)
            assert (i * 2 + 1).to_numpy().tolist() == [7, -3, 15] and (i * 2).dtype == "int64"


@pytest.mark.parametrize("sa,sb,ta,tb", [((3, 5), (5, 4), False, False), ((3, 5), (4, 5), False, True),
                                         ((5, 3), (5, 4), True, False), ((2, 3, 5), (5, 7), False, False),
                                         ((4, 1, 3, 5), (2, 5, 6), False, False), ((2, 7, 9), (2, 9, 1), False, False),
                                         ((1, 64), (64, 1), False, False), ((6, 2, 3, 8), (6, 2, 3, 8), False, True)])
def test_matmul_layouts(cuda, sa, sb, ta, tb):
    r = np.random.default_rng(1)
    a = r.standard_normal(sa).astype(np.float32)
    b = r.standard_normal(sb).astype(np.float32)
    (af, ac), (bf, bc) = pair(a, cuda), pair(b, cuda)
    if ta:
        af, ac = af.transpose(-2, -1), ac.transpose(-2, -1)
    if tb:
        bf, bc = bf.transpose(-2, -1), bc.transpose(-2, -1)
    with minitorch.no_grad():
        close(af @ bf, ac @ bc, 1e-4, 1e-4)
        bf16 = (ac.to("bfloat16") @ bc.to("bfloat16")).to("float32")
        ref = round_bf16(np.asarray(af.to_numpy())) @ round_bf16(np.asarray(bf.to_numpy()))
        np.testing.assert_allclose(bf16.to_numpy(), ref, rtol=2e-2, atol=3e-2)


def test_fused_slots_match_fast_backend(cuda):
    r = np.random.default_rng(2)
    x = r.standard_normal((2, 3, 5, 64)).astype(np.float32)
    w = r.standard_normal(64).astype(np.float32)
    (xf, xc), (wf, wc) = pair(x, cuda, (0, 2, 1, 3)), pair(w, cuda)
    ang = r.uniform(-3, 3, (5, 32)).astype(np.float32)
    (cf, cc), (sf, sc) = pair(np.cos(np.concatenate([ang, ang], -1)), cuda), pair(np.sin(np.concatenate([ang, ang], -1)), cuda)
    with minitorch.no_grad():
        for d in (-1, 1, 2):
            close(nn.softmax(xf, d), nn.softmax(xc, d))
            close(nn.log_softmax(xf, d), nn.log_softmax(xc, d), 1e-5, 1e-4)
        close(nn.rmsnorm(xf, wf, 1e-6), nn.rmsnorm(xc, wc, 1e-6), 1e-5, 1e-4)
        close(nn.layernorm(xf, wf, wf, 1e-5), nn.layernorm(xc, wc, wc, 1e-5), 1e-5, 1e-4)
        close(nn.rope(xf, cf, sf), nn.rope(xc, cc, sc))
        close(nn.silu_mul(xf, xf * 2.0), nn.silu_mul(xc, xc * 2.0))
        ids = np.array([[0, 5, 2], [1, 1, 7]], np.int64)
        emb = r.standard_normal((9, 16)).astype(np.float32)
        (ef, ec), (idf, idc) = pair(emb, cuda), pair(ids, cuda)
        close(nn.embedding(ef, idf), nn.embedding(ec, idc))
        with pytest.raises(minitorch.MiniTorchError, match="out of range"):
            nn.embedding(ec, minitorch.tensor([[9]], dtype="int64", backend=cuda))
        close(nn.cat([xf, xf * 2.0], 2), nn.cat([xc, xc * 2.0], 2))
        q = r.standard_normal((1, 6, 4, 32)).astype(np.float32)
        kv = r.standard_normal((1, 2, 10, 32)).astype(np.float32)
        (qf, qc), (kf, kc) = pair(q, cuda), pair(kv, cuda)
        close(nn.attention(qf, kf, kf * 0.5, 32 ** -0.5, 6), nn.attention(qc, kc, kc * 0.5, 32 ** -0.5, 6), 1e-4, 1e-5)


def test_copy_into_strided_cache_view_and_bf16_roundtrip(cuda):
    r = np.random.default_rng(3)
    cache = minitorch.zeros((1, 2, 16, 8), backend=cuda)
    k = r.standard_normal((1, 2, 3, 8)).astype(np.float32)
    kc = minitorch.from_numpy(k, backend=cuda)
    with minitorch.no_grad():
        cache.narrow(2, 5, 3).copy_(kc)
        got = cache.to_numpy()
        np.testing.assert_array_equal(got[:, :, 5:8], k)
        assert (got[:, :, :5] == 0).all() and (got[:, :, 8:] == 0).all()
        b = kc.to("bfloat16")
        assert b.dtype == "bfloat16"
        np.testing.assert_array_equal(b.to_numpy(), round_bf16(k))
        np.testing.assert_array_equal((b * 2.0).to_numpy(), round_bf16(k) * 2)  # scalar keeps bf16
        assert (b * 2.0).dtype == "bfloat16"
        kb = round_bf16(k).astype(np.float64)
        y = nn.rmsnorm(b, b[0, 0, 0], 1e-6)
        assert y.dtype == "bfloat16"
        want = kb / np.sqrt((kb ** 2).mean(-1, keepdims=True) + 1e-6) * kb[0, 0, 0]
        np.testing.assert_allclose(y.to_numpy(), want, rtol=2e-2, atol=2e-2)


def test_gradients_flow_on_cuda(cuda):
    r = np.random.default_rng(4)
    x = r.standard_normal((3, 4)).astype(np.float32)
    w = r.standard_normal((5, 4)).astype(np.float32)
    grads = []
    for be in (FastBackend, cuda):
        xt = minitorch.from_numpy(x.copy(), backend=be).requires_grad_(True)
        wt = minitorch.from_numpy(w.copy(), backend=be).requires_grad_(True)
        nn.softmax(nn.linear(xt, wt), -1).log().sum().backward()
        grads.append((xt.grad.to_numpy(), wt.grad.to_numpy()))
    for gf, gc in zip(*grads):
        np.testing.assert_allclose(gc, gf, rtol=1e-4, atol=1e-5)


def test_nvrtc_fallback_compiles_the_same_sources(tmp_path, capsys):
    import cupy as cp

    from minitorch.cuda.launch import View
    from minitorch.cuda.runtime import KernelLibrary

    lib = KernelLibrary(build_dir=tmp_path)  # empty: no fatbins -> NVRTC
    x = cp.asarray(np.random.default_rng(5).standard_normal((3, 1000)).astype(np.float32))
    out = cp.empty_like(x)
    lib.launch("softmax_f32", (3,), (256,), (x, out, np.int32(1000), np.int32(0)))
    assert lib.sources["softmax"] == "nvrtc"
    assert "compiling kernels/softmax.cu with NVRTC" in capsys.readouterr().err
    xh = x.get().astype(np.float64)
    want = np.exp(xh - xh.max(-1, keepdims=True))
    np.testing.assert_allclose(out.get(), want / want.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
    del View


def test_bf16_creation_from_numpy_and_full(cuda):
    """from_numpy(dtype='bfloat16') and full/ones in bf16 store real bf16 bits, not float32 bits."""
    x = np.linspace(-3, 3, 37, dtype=np.float32).reshape(1, 37)
    t = minitorch.from_numpy(x, backend=cuda, dtype="bfloat16")
    assert t.dtype == "bfloat16"
    np.testing.assert_array_equal(t.to_numpy(), round_bf16(x))
    o = minitorch.full((3, 5), 1.5, backend=cuda, dtype="bfloat16")
    assert o.dtype == "bfloat16"
    np.testing.assert_array_equal(o.to_numpy(), np.full((3, 5), 1.5, np.float32))
    np.testing.assert_array_equal(minitorch.ones((2,), backend=cuda, dtype="bfloat16").to_numpy(), [1.0, 1.0])


def test_tf32_is_for_float32_products_only_and_switches_back(cuda):
    """blas.set_tf32: float32 products on the tensor cores round their inputs to TF32 (errors near 2^-11 of the
    operands, well over fp32's), within TF32's bound of float64's product; bf16 products are the same bits either
    way; set_tf32(False) restores the exact fp32 products (the decode paths' only mode)."""
    from minitorch.cuda.blas import set_tf32

    r = np.random.default_rng(5)
    a, b = r.standard_normal((96, 512)).astype(np.float32), r.standard_normal((512, 80)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    ac, bc = (minitorch.from_numpy(x, backend=cuda) for x in (a, b))
    fp32 = np.asarray((ac @ bc).to_numpy(), np.float64)
    bf = np.asarray((ac.to("bfloat16") @ bc.to("bfloat16")).to("float32").to_numpy())
    assert set_tf32(True) is False
    try:
        tf = np.asarray((ac @ bc).to_numpy(), np.float64)
        bf_tf = np.asarray((ac.to("bfloat16") @ bc.to("bfloat16")).to("float32").to_numpy())
    finally:
        assert set_tf32(False) is True
    bound = 2.0 ** -10 * (np.abs(a) @ np.abs(b))  # two inputs rounded to 10-bit mantissas
    assert (np.abs(tf - ref) <= bound).all()
    assert np.abs(tf - ref).max() > 20 * np.abs(fp32 - ref).max()  # it did run in TF32
    np.testing.assert_array_equal(bf_tf, bf)
    again = np.asarray((ac @ bc).to_numpy(), np.float64)
    np.testing.assert_array_equal(again, fp32)
