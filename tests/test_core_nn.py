"""nn ops against torch (the oracle only): values and gradients with explicit tolerances, on every
backend, with permuted inputs; plus a decoder-block composition."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st

import minitorch
from minitorch import nn
from backends import BACKENDS, array_and_perm, make, np_of

TOL = dict(rtol=1e-4, atol=1e-5)


def tt(a: np.ndarray) -> torch.Tensor:
    return torch.tensor(np.asarray(a, dtype=np.float32), requires_grad=True)


def check_grad(ours: minitorch.Tensor, theirs: torch.Tensor, **tol) -> None:
    assert ours.grad is not None, "no gradient reached the input"
    np.testing.assert_allclose(np_of(ours.grad), theirs.grad.numpy(), **(tol or TOL))


def backprop_both(out: minitorch.Tensor, tout: torch.Tensor, seed: int = 0) -> None:
    """loss = sum(out * W) with the same random W on both sides."""
    w = np.random.default_rng(seed).standard_normal(tout.shape).astype(np.float32)
    np.testing.assert_allclose(np_of(out), tout.detach().numpy(), **TOL)
    (out * minitorch.from_numpy(w, backend=out.backend)).sum().backward()
    (tout * torch.tensor(w)).sum().backward()


@pytest.mark.parametrize("backend", BACKENDS)
@given(data=array_and_perm(lo=-20, hi=20), dim_seed=st.integers(0, 3), log=st.booleans())
def test_softmax_log_softmax(backend, data, dim_seed, log):
    a, perm = data
    d = dim_seed % a.ndim
    x, tx = make(a, backend, perm, True), tt(a)
    out = (nn.log_softmax if log else nn.softmax)(x, d)
    backprop_both(out, (torch.log_softmax if log else torch.softmax)(tx, d))
    check_grad(x, tx)


def tt64(a: np.ndarray) -> torch.Tensor:
    return torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=True)


# A row of two close values ([1.8275536, 1.7104751]: a tiny variance) where torch's float32 layer-norm gradient is 0.7%
# off the float64 one and ours 1e-5 (CI found it, 2026-12-06): the oracle runs in float64
_CLOSE_ROW = np.zeros((3, 3, 2), np.float32)
_CLOSE_ROW[0, 0] = [1.8275536, 1.7104751]


@pytest.mark.parametrize("backend", BACKENDS)
@given(data=array_and_perm(), seed=st.integers(0, 99))
@example(data=(_CLOSE_ROW, [0, 1, 2]), seed=3)
def test_layernorm_rmsnorm(backend, data, seed):
    """Values and gradients against torch in float64 (torch's own float32 gradient of a tiny-variance row is further
    from the truth than ours: _CLOSE_ROW)."""
    a, perm = data
    n = a.shape[-1]
    rng = np.random.default_rng(seed)
    w, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    for kind in ("layer", "rms"):
        x, tx = make(a, backend, perm, True), tt64(a)
        mw, tw = make(w, backend, None, True), tt64(w)
        mb, tb = make(b, backend, None, True), tt64(b)
        if kind == "layer":
            out, tout = nn.layernorm(x, mw, mb, 1e-5), F.layer_norm(tx, (n,), tw, tb, 1e-5)
        else:
            out, tout = nn.rmsnorm(x, mw, 1e-6), F.rms_norm(tx, (n,), tw, 1e-6)
        backprop_both(out, tout, seed)
        tol = dict(rtol=2e-3, atol=2e-4)  # normalizing tiny-variance rows amplifies float32 rounding
        check_grad(x, tx, **tol)
        check_grad(mw, tw, **tol)
        if kind == "layer":
            check_grad(mb, tb, **tol)


@pytest.mark.parametrize("backend", BACKENDS)
@given(n=st.integers(1, 3), k=st.integers(1, 4), m=st.integers(1, 3), seed=st.integers(0, 99))
def test_matmul_and_linear_grads(backend, n, k, m, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((2, n, k)).astype(np.float32)
    w = rng.standard_normal((m, k)).astype(np.float32)        # (out, in) as in checkpoints
    bias = rng.standard_normal(m).astype(np.float32)
    x, tx = make(a, backend, (2, 0, 1), True), tt(a)
    mw, tw = make(w, backend, None, True), tt(w)
    mb, tb = make(bias, backend, None, True), tt(bias)
    backprop_both(nn.linear(x, mw, mb), F.linear(tx, tw, tb), seed)
    for ours, theirs in ((x, tx), (mw, tw), (mb, tb)):
        check_grad(ours, theirs)
    b2 = rng.standard_normal((k, m)).astype(np.float32)
    x2, tx2 = make(a, backend, None, True), tt(a)
    mb2, tb2 = make(b2, backend, None, True), tt(b2)
    backprop_both(x2 @ mb2, tx2 @ tb2, seed)
    check_grad(x2, tx2)
    check_grad(mb2, tb2)


@pytest.mark.parametrize("backend", BACKENDS)
@given(ids=st.lists(st.integers(0, 5), min_size=1, max_size=6), seed=st.integers(0, 99))
def test_embedding_gather_scatter_add(backend, ids, seed):
    w = np.random.default_rng(seed).standard_normal((6, 3)).astype(np.float32)
    mw, tw = make(w, backend, None, True), tt(w)
    idx = np.array(ids, dtype=np.int64).reshape(1, -1)
    out = nn.embedding(mw, minitorch.from_numpy(idx, backend=backend))
    assert out.shape == (1, len(ids), 3)
    backprop_both(out, F.embedding(torch.tensor(idx), tw), seed)
    check_grad(mw, tw)  # repeated ids accumulate


def rope_tables(t: int, d: int, start: int = 0, theta: float = 10000.0):
    inv = 1.0 / theta ** (np.arange(0, d, 2) / d)
    ang = np.outer(np.arange(start, start + t), inv)
    emb = np.concatenate([ang, ang], -1)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


def torch_rope(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin


@pytest.mark.parametrize("backend", BACKENDS)
@given(t=st.integers(1, 4), half=st.integers(1, 4), start=st.integers(0, 5), seed=st.integers(0, 99))
def test_rope(backend, t, half, start, seed):
    d = 2 * half
    a = np.random.default_rng(seed).standard_normal((1, 2, t, d)).astype(np.float32)
    cos, sin = rope_tables(t, d, start)
    x, tx = make(a, backend, (0, 2, 1, 3), True), tt(a)               # (B, H, T, D) as a permuted view
    out = nn.rope(x, make(cos, backend).view(1, 1, t, d), make(sin, backend))
    backprop_both(out, torch_rope(tx, torch.tensor(cos), torch.tensor(sin)), seed)
    check_grad(x, tx)


def torch_attention(q, k, v, q_start):
    g = q.shape[1] // k.shape[1]
    t, length = q.shape[2], k.shape[2]
    mask = torch.arange(length)[None, :] <= (q_start + torch.arange(t))[:, None]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), attn_mask=mask)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=12)
@given(hkv=st.integers(1, 2), g=st.integers(1, 3), t=st.integers(1, 3), past=st.integers(0, 3),
       d=st.sampled_from([2, 4, 8]), seed=st.integers(0, 99))
def test_attention_gqa_causal(backend, hkv, g, t, past, d, seed):
    rng = np.random.default_rng(seed)
    length = past + t
    q = rng.standard_normal((1, hkv * g, t, d)).astype(np.float32)
    k = rng.standard_normal((1, hkv, length, d)).astype(np.float32)
    v = rng.standard_normal((1, hkv, length, d)).astype(np.float32)
    mq, tq = make(q, backend, (0, 2, 1, 3), True), tt(q)
    mk, tk = make(k, backend, None, True), tt(k)
    mv, tv = make(v, backend, None, True), tt(v)
    out = nn.attention(mq, mk, mv, None, past)
    backprop_both(out, torch_attention(tq, tk, tv, past), seed)
    for ours, theirs in ((mq, tq), (mk, tk), (mv, tv)):
        check_grad(ours, theirs)
    # reading the keys through a narrowed, preallocated cache view gives the same result
    cache = minitorch.zeros((1, hkv, length + 3, d), backend=backend)
    cache.narrow(2, 0, length).copy_(make(k, backend))
    vcache = minitorch.zeros((1, hkv, length + 3, d), backend=backend)
    vcache.narrow(2, 0, length).copy_(make(v, backend))
    with minitorch.no_grad():
        out2 = nn.attention(make(q, backend), cache.narrow(2, 0, length), vcache.narrow(2, 0, length), None, past)
    np.testing.assert_allclose(np_of(out2), np_of(out), **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
@given(data=array_and_perm(), seed=st.integers(0, 99))
def test_silu_mul_and_cat(backend, data, seed):
    a, perm = data
    b = np.random.default_rng(seed).standard_normal(a.shape).astype(np.float32)
    g, tg = make(a, backend, perm, True), tt(a)
    u, tu = make(b, backend, None, True), tt(b)
    backprop_both(nn.silu_mul(g, u), F.silu(tg) * tu, seed)
    check_grad(g, tg)
    check_grad(u, tu)
    x1, t1 = make(a, backend, perm, True), tt(a)
    x2, t2 = make(b, backend, None, True), tt(b)
    backprop_both(nn.cat([x1, x2], -1), torch.cat([t1, t2], -1), seed)
    check_grad(x1, t1)
    check_grad(x2, t2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_decoder_block_composition(backend):
    """embedding -> rmsnorm -> q/k/v linear -> rope -> GQA attention -> o-proj + residual -> rmsnorm
    -> SwiGLU MLP -> logits -> log_softmax NLL: loss and every weight gradient match torch."""
    rng = np.random.default_rng(0)
    v_sz, hid, hq, hkv, hd, inter, t = 11, 8, 4, 2, 2, 12, 5
    shapes = {"emb": (v_sz, hid), "n1": (hid,), "wq": (hq * hd, hid), "bq": (hq * hd,), "wk": (hkv * hd, hid),
              "bk": (hkv * hd,), "wv": (hkv * hd, hid), "bv": (hkv * hd,), "wo": (hid, hq * hd), "n2": (hid,),
              "wg": (inter, hid), "wu": (inter, hid), "wd": (hid, inter), "head": (v_sz, hid)}
    ws = {k: (rng.standard_normal(s) * 0.5).astype(np.float32) for k, s in shapes.items()}
    ids = rng.integers(0, v_sz, (1, t))
    targets = rng.integers(0, v_sz, (t,))
    cos, sin = rope_tables(t, hd)

    def run(P, lib):
        if lib == "mt":
            lin, rms, att, rope_, smx = nn.linear, lambda x, w: nn.rmsnorm(x, w, 1e-6), \
                lambda q, k, v: nn.attention(q, k, v, None, 0), nn.rope, nn.log_softmax
            x = nn.embedding(P["emb"], minitorch.from_numpy(ids, backend=backend))
            c, s = make(cos, backend), make(sin, backend)
        else:
            lin, rms, att, rope_, smx = F.linear, lambda x, w: F.rms_norm(x, (hid,), w, 1e-6), \
                lambda q, k, v: torch_attention(q, k, v, 0), torch_rope, torch.log_softmax
            x = F.embedding(torch.tensor(ids), P["emb"])
            c, s = torch.tensor(cos), torch.tensor(sin)
        h = rms(x, P["n1"])
        q = lin(h, P["wq"], P["bq"]).view(1, t, hq, hd).permute(0, 2, 1, 3)     # (B, Hq, T, hd)
        k = lin(h, P["wk"], P["bk"]).view(1, t, hkv, hd).permute(0, 2, 1, 3)    # (B, Hkv, T, hd)
        v = lin(h, P["wv"], P["bv"]).view(1, t, hkv, hd).permute(0, 2, 1, 3)
        o = att(rope_(q, c, s), rope_(k, c, s), v).permute(0, 2, 1, 3).reshape(1, t, hq * hd)
        x = x + lin(o, P["wo"])
        h = rms(x, P["n2"])
        g, u = lin(h, P["wg"]), lin(h, P["wu"])
        x = x + lin(F.silu(g) * u if lib == "th" else nn.silu_mul(g, u), P["wd"])
        logp = smx(lin(x, P["head"]), -1)                                         # (1, T, V)
        if lib == "mt":
            onehot = np.eye(v_sz, dtype=np.float32)[targets][None]
            return -(logp * make(onehot, backend)).sum() * (1.0 / t)
        return F.nll_loss(logp[0], torch.tensor(targets))

    mp = {k: make(a, backend, None, True) for k, a in ws.items()}
    tp = {k: tt(a) for k, a in ws.items()}
    loss, tloss = run(mp, "mt"), run(tp, "th")
    np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-5)
    loss.backward()
    tloss.backward()
    for k in ws:
        check_grad(mp[k], tp[k], rtol=1e-3, atol=1e-5)
