"""Property tests: every elementwise op, reduction, matmul and where on every backend, with permuted
(non-contiguous) inputs and broadcasting, against numpy computed in float64."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import minitorch
from backends import BACKENDS, array_and_perm, arrays, broadcast_pair, make, np_of

UNARY = {
    "neg": (lambda t: -t, lambda a: -a, None),
    "exp": (lambda t: t.exp(), np.exp, None),
    "log": (lambda t: t.log(), np.log, "pos"),
    "sqrt": (lambda t: t.sqrt(), np.sqrt, "pos"),
    "rsqrt": (lambda t: t.rsqrt(), lambda a: 1 / np.sqrt(a), "pos"),
    "sigmoid": (lambda t: t.sigmoid(), lambda a: 1 / (1 + np.exp(-a)), None),
    "relu": (lambda t: t.relu(), lambda a: np.maximum(a, 0), None),
    "silu": (lambda t: t.silu(), lambda a: a / (1 + np.exp(-a)), None),
    "tanh": (lambda t: t.tanh(), np.tanh, None),
    "pow2": (lambda t: t ** 2.0, lambda a: a ** 2, None),
    "pow_half": (lambda t: t ** 0.5, lambda a: a ** 0.5, "pos"),
}
BINARY = {
    "add": (lambda x, y: x + y, np.add),
    "sub": (lambda x, y: x - y, np.subtract),
    "mul": (lambda x, y: x * y, np.multiply),
    "div": (lambda x, y: x / y, np.divide),
    "lt": (lambda x, y: x < y, lambda a, b: (a < b).astype(np.float32)),
    "gt": (lambda x, y: x > y, lambda a, b: (a > b).astype(np.float32)),
    "eq": (lambda x, y: x == y, lambda a, b: (a == b).astype(np.float32)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(UNARY))
@given(data=array_and_perm())
def test_unary(backend, name, data):
    a, perm = data
    fn, ref, domain = UNARY[name]
    if domain == "pos":
        a = np.abs(a) + 0.1
    out = fn(make(a, backend, perm))
    assert out.shape == a.shape and out.dtype == "float32"
    np.testing.assert_allclose(np_of(out), ref(a.astype(np.float64)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(BINARY))
@given(pair=broadcast_pair(), perm_seed=st.integers(0, 10))
def test_binary_broadcast(backend, name, pair, perm_seed):
    a, b = pair
    if name == "div":
        b = np.where(np.abs(b) < 0.1, 0.5, b).astype(np.float32)
    if name == "eq":
        b = np.where(b > 0, b, 1.0).astype(np.float32)
        a = np.where(a > 0, a, 1.0).astype(np.float32)
    rng = np.random.default_rng(perm_seed)
    ta = make(a, backend, rng.permutation(a.ndim) if a.ndim > 1 else None)
    tb = make(b, backend, rng.permutation(b.ndim) if b.ndim > 1 else None)
    fn, ref = BINARY[name]
    out = fn(ta, tb)
    expect = ref(a.astype(np.float64), b.astype(np.float64))
    assert out.shape == expect.shape
    np.testing.assert_allclose(np_of(out), expect, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@given(a=arrays(), s=st.floats(-2, 2, width=32))
def test_scalar_both_sides(backend, a, s):
    t = make(a, backend)
    np.testing.assert_allclose(np_of(t + s), a + s, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np_of(s - t), s - a, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np_of(s * t), s * a, rtol=1e-6, atol=1e-6)
    d = np.where(np.abs(a) < 0.1, 1.0, a).astype(np.float32)
    np.testing.assert_allclose(np_of(2.0 / make(d, backend)), 2.0 / d, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@given(data=array_and_perm(), dim_seed=st.integers(0, 5), keepdim=st.booleans())
def test_reductions(backend, data, dim_seed, keepdim):
    a, perm = data
    t = make(a, backend, perm)
    d = dim_seed % a.ndim
    a64 = a.astype(np.float64)
    np.testing.assert_allclose(np_of(t.sum(d, keepdim)), a64.sum(d, keepdims=keepdim), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np_of(t.mean(d, keepdim)), a64.mean(d, keepdims=keepdim), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np_of(t.max(d, keepdim)), a64.max(d, keepdims=keepdim))
    am = t.argmax(d, keepdim)
    assert am.dtype == "int64"
    np.testing.assert_array_equal(np_of(am), np.expand_dims(a.argmax(d), d) if keepdim else a.argmax(d))
    np.testing.assert_allclose(t.sum().item(), a64.sum(), rtol=1e-5, atol=1e-4)
    assert t.sum().shape == ()


@pytest.mark.parametrize("backend", BACKENDS)
@given(n=st.integers(1, 4), k=st.integers(1, 4), m=st.integers(1, 4), batch=st.sampled_from(
    [((), ()), ((2,), ()), ((), (3,)), ((2, 1), (3,)), ((1, 2), (2, 1))]), tr=st.booleans(), seed=st.integers(0, 99))
def test_matmul_batched_broadcast(backend, n, k, m, batch, tr, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(batch[0] + (n, k)).astype(np.float32)
    b = rng.standard_normal(batch[1] + (k, m)).astype(np.float32)
    ta = make(a, backend)
    tb = make(np.ascontiguousarray(np.swapaxes(b, -1, -2)), backend).transpose(-1, -2) if tr else make(b, backend)
    out = ta @ tb
    np.testing.assert_allclose(np_of(out), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@given(pair=broadcast_pair(), fill=st.floats(-5, 5, width=32))
def test_where_and_masked_fill(backend, pair, fill):
    a, b = pair
    cond = (a > 0).astype(np.float32)
    out = minitorch.where(make(cond, backend), make(a, backend), make(b, backend))
    np.testing.assert_allclose(np_of(out), np.where(cond != 0, a, b))
    mf = make(b, backend).masked_fill(make(cond, backend), float("-inf"))
    np.testing.assert_array_equal(np_of(mf), np.where(cond != 0, -np.inf, b + np.zeros_like(cond)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_int64_ops(backend):
    ids = minitorch.tensor([[3, 1, 2]], dtype="int64", backend=backend)
    assert (ids + 1).dtype == "int64" and np_of(ids + 1).tolist() == [[4, 2, 3]]
    assert (ids * ids).dtype == "int64"
    eq = ids == 2
    assert eq.dtype == "float32" and np_of(eq).tolist() == [[0, 0, 1]]
    assert (ids * 0.5).dtype == "float32"
    assert np_of(ids.argmax(-1)).tolist() == [0]
    assert ids.max(1).item() == 3 and ids.sum().item() == 6
    f = ids.float()
    assert f.dtype == "float32" and np_of(f.long()).tolist() == [[3, 1, 2]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_and_inf_follow_numpy(backend):
    a = np.array([0.0, -1.0, np.inf, -np.inf, np.nan], dtype=np.float32)
    t = make(a, backend)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(np_of(t.log()), np.log(a), rtol=1e-6)
        np.testing.assert_allclose(np_of(t.exp()), np.exp(a), rtol=1e-6)
        np.testing.assert_allclose(np_of(1.0 / t), 1.0 / a, rtol=1e-6)
    assert np.isnan(t.max(0).item()) and t.argmax(0).item() == 4
