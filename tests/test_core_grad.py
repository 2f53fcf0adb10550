"""Central-difference gradient checks for every differentiable op, on every backend, with permuted
inputs and broadcasting."""
from __future__ import annotations

from typing import Callable, List

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minitorch
from minitorch import nn
from backends import BACKENDS, array_and_perm, broadcast_pair, make, np_of

EPS = 1e-2


def gradcheck(backend, fn: Callable[..., minitorch.Tensor], arrays: List[np.ndarray], perms=None,
              rtol: float = 3e-2, atol: float = 3e-3, seed: int = 0) -> None:
    """Compare autodiff grads of sum(fn(*xs) * W) with central differences (float32, eps 1e-2)."""
    perms = perms or [None] * len(arrays)
    xs = [make(a, backend, p, True) for a, p in zip(arrays, perms)]
    out = fn(*xs)
    w = np.random.default_rng(seed).standard_normal(out.shape).astype(np.float32)
    tw = minitorch.from_numpy(w, backend=backend)
    (out * tw).sum().backward()

    def loss(vals):
        with minitorch.no_grad():
            return float(np.sum(np_of(fn(*[make(v, backend) for v in vals])).astype(np.float64) * w))

    for i, a in enumerate(arrays):
        num = np.zeros(a.shape, np.float64)
        for idx in np.ndindex(*a.shape):
            plus = [x.copy() for x in arrays]
            minus = [x.copy() for x in arrays]
            plus[i][idx] += EPS
            minus[i][idx] -= EPS
            num[idx] = (loss(plus) - loss(minus)) / (2 * EPS)
        assert xs[i].grad is not None, f"no grad for input {i}"
        np.testing.assert_allclose(np_of(xs[i].grad), num, rtol=rtol, atol=atol, err_msg=f"input {i}")


def away_from_zero(a: np.ndarray) -> np.ndarray:
    return np.where(np.abs(a) < 0.2, 0.5, a).astype(np.float32)


UNARY = {
    "neg": lambda x: -x, "exp": lambda x: x.exp(), "log": lambda x: (x * x + 0.5).log(),
    "sqrt": lambda x: (x * x + 0.5).sqrt(), "rsqrt": lambda x: (x * x + 0.5).rsqrt(),
    "sigmoid": lambda x: x.sigmoid(), "relu": lambda x: x.relu(), "silu": lambda x: x.silu(),
    "tanh": lambda x: x.tanh(), "pow": lambda x: x ** 3.0, "contiguous": lambda x: x.contiguous() * 1.0,
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(UNARY))
@given(data=array_and_perm(lo=-2, hi=2))
def test_unary_grad(backend, name, data):
    a, perm = data
    gradcheck(backend, UNARY[name], [away_from_zero(a)], [perm])


BINARY = {
    "add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
    "div": lambda x, y: x / y, "pow": lambda x, y: (x * x + 0.5) ** y,
    "where": lambda x, y: minitorch.where(x > 0.0, x * 2.0, y),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(BINARY))
@settings(max_examples=15)
@given(pair=broadcast_pair())
def test_binary_grad_broadcast(backend, name, pair):
    a, b = (away_from_zero(x) for x in pair)
    if name == "pow":
        b = np.clip(b, -2, 2)
    gradcheck(backend, BINARY[name], [a, b])


@pytest.mark.parametrize("backend", BACKENDS)
@given(data=array_and_perm(lo=-2, hi=2), dim=st.integers(0, 2), keep=st.booleans())
def test_reduce_grads(backend, data, dim, keep):
    a, perm = data
    d = dim % a.ndim
    gradcheck(backend, lambda x: x.sum(d, keep), [a], [perm])
    gradcheck(backend, lambda x: x.mean(d, keep), [a], [perm])
    gradcheck(backend, lambda x: x.mean(), [a], [perm])
    distinct = (np.arange(a.size, dtype=np.float32).reshape(a.shape) * 0.37) % 3.1  # no ties
    gradcheck(backend, lambda x: x.max(d, keep), [distinct], [perm])
    gradcheck(backend, lambda x: x.masked_fill(x > 1.0, -3.0), [away_from_zero(a - 1.0) + 1.0], [perm])


@pytest.mark.parametrize("backend", BACKENDS)
@given(data=array_and_perm(lo=-2, hi=2))
def test_view_grads(backend, data):
    a, perm = data
    n = a.ndim
    gradcheck(backend, lambda x: x.permute(*reversed(range(n))), [a], [perm])
    gradcheck(backend, lambda x: x.reshape(-1) * 1.0, [a], [perm])
    gradcheck(backend, lambda x: x.contiguous().view(a.size), [a], [perm])
    gradcheck(backend, lambda x: x.unsqueeze(0).expand(2, *a.shape), [a], [perm])
    gradcheck(backend, lambda x: x[0] * x[-1], [a], [perm])
    gradcheck(backend, lambda x: x.narrow(-1, 0, 1).squeeze(-1), [a], [perm])
    gradcheck(backend, lambda x: x.transpose(0, -1)[..., :1], [a], [perm])


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=15)
@given(n=st.integers(1, 3), k=st.integers(1, 3), m=st.integers(1, 3), seed=st.integers(0, 99))
def test_matmul_linear_grad(backend, n, k, m, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((2, n, k)).astype(np.float32)
    b = rng.standard_normal((k, m)).astype(np.float32)
    gradcheck(backend, lambda x, y: x @ y, [a, b], [(1, 2, 0), None])
    w = rng.standard_normal((m, k)).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32)
    gradcheck(backend, lambda x, y, z: nn.linear(x, y, z), [a, w, bias])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_shared_weights_gradient_is_one_product_in_its_own_layout(backend):
    """A weight used by a batch of rows (nn.linear on (B, T, in), three times as the draft head's training does)
    gets its gradient from one (out, rows) @ (rows, in) product a use, no batched product summed afterwards, and
    it lands contiguous; its values equal float64's sum over the rows."""
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((3, 4, 5)).astype(np.float32) for _ in range(3)]
    gs = [rng.standard_normal((3, 4, 6)).astype(np.float32) for _ in range(3)]
    w = minitorch.from_numpy(rng.standard_normal((6, 5)).astype(np.float32), backend=backend)
    w.requires_grad_(True)
    loss = None
    for x, g in zip(xs, gs):
        term = (nn.linear(minitorch.from_numpy(x, backend=backend), w) * minitorch.from_numpy(g, backend=backend)).sum()
        loss = term if loss is None else loss + term
    shapes = []
    real = backend.matrix_multiply
    backend.matrix_multiply = lambda a, b, out=None: (shapes.append((a.shape, b.shape)), real(a, b, out))[1]
    try:
        loss.backward()
    finally:
        backend.matrix_multiply = real
    assert shapes == [((6, 12), (12, 5))] * 3, shapes
    assert w.grad._tensor.is_contiguous()
    want = sum(np.einsum("btn,btk->nk", g.astype(np.float64), x.astype(np.float64)) for x, g in zip(xs, gs))
    np.testing.assert_allclose(np.asarray(w.grad.to_numpy()), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=10)
@given(data=array_and_perm(lo=-2, hi=2), seed=st.integers(0, 99))
def test_nn_grads(backend, data, seed):
    a, perm = data
    rng = np.random.default_rng(seed)
    n = a.shape[-1]
    d = (seed % a.ndim)
    w, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    gradcheck(backend, lambda x: nn.softmax(x, d), [a], [perm])
    gradcheck(backend, lambda x: nn.log_softmax(x, d), [a], [perm])
    gradcheck(backend, lambda x, g, u: nn.silu_mul(x, u) * g, [a, a * 0.5, a + 1.0], [perm, None, None])
    gradcheck(backend, lambda x, y: nn.cat([x, y * 2.0], d), [a, a + 1.0], [perm, None])
    if n > 1:  # normalizing a single element is constant
        spread = (0.1 * a + np.linspace(-1, 1, n, dtype=np.float32)).astype(np.float32)  # rows keep variance
        gradcheck(backend, lambda x, ww: nn.rmsnorm(x, ww, 1e-6), [spread, w], [perm, None], rtol=5e-2, atol=5e-3)
        gradcheck(backend, lambda x, ww, bb: nn.layernorm(x, ww, bb, 1e-5), [spread, w, b], [perm, None, None],
                  rtol=5e-2, atol=5e-3)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=8)
@given(seed=st.integers(0, 99), past=st.integers(0, 2), g=st.integers(1, 2))
def test_embedding_rope_attention_grads(backend, seed, past, g):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((5, 4)).astype(np.float32)
    ids = minitorch.from_numpy(np.array([[1, 3, 1]]), backend=backend)
    gradcheck(backend, lambda x: nn.embedding(x, ids), [w])
    t, d = 2, 4
    x = rng.standard_normal((1, 2, t, d)).astype(np.float32)
    cos, sin = rng.standard_normal((t, d)).astype(np.float32), rng.standard_normal((t, d)).astype(np.float32)
    gradcheck(backend, lambda a, c, s: nn.rope(a, c, s), [x, cos, sin], [(0, 2, 1, 3), None, None])
    q = rng.standard_normal((1, 2 * g, t, d)).astype(np.float32)
    k = rng.standard_normal((1, 2, past + t, d)).astype(np.float32)
    v = rng.standard_normal((1, 2, past + t, d)).astype(np.float32)
    gradcheck(backend, lambda a, b, c: nn.attention(a, b, c, 0.7, past), [q, k, v], [(0, 2, 1, 3), None, None])


@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_accumulates_and_shared_inputs(backend):
    x = minitorch.tensor([1.0, 2.0, 3.0], backend=backend, requires_grad=True)
    y = (x * x + x).sum()          # x used twice in one graph
    y.backward()
    np.testing.assert_allclose(np_of(x.grad), [3.0, 5.0, 7.0])
    (x * 2.0).sum().backward()      # a second backward accumulates
    np.testing.assert_allclose(np_of(x.grad), [5.0, 7.0, 9.0])
    with pytest.raises(minitorch.MiniTorchError, match="one-element"):
        (x * 2.0).backward()


# ---- float64 references: a 1% error in a backward is caught ------------------------------------------------
# The checks above differentiate our own float32 forward with eps 1e-2, so they need rtol 3e-2 and a backward
# off by 2% passes. Here the numerical derivative is taken of an independent numpy float64 forward (eps 1e-6:
# truncation error ~eps^2 |f'''| ~ 1e-12, cancellation ~1e-16 |f| / eps ~ 1e-9) and the float32 autodiff
# gradient must match it to rtol 1e-4: float32 rounding of a few ops and sums of up to ~100 terms stays below
# ~1e-5 relative to the gradient's magnitude (atol scales with the largest gradient entry).
EPS64 = 1e-6
RTOL64 = 1e-4


def gradcheck64(backend, fn: Callable[..., minitorch.Tensor], ref: Callable[..., np.ndarray],
                arrays: List[np.ndarray], perms=None, seed: int = 0) -> None:
    """Autodiff grads of sum(fn(*xs) * W) against float64 central differences of sum(ref(*xs) * W)."""
    perms = perms or [None] * len(arrays)
    xs = [make(a, backend, p, True) for a, p in zip(arrays, perms)]
    out = fn(*xs)
    w = np.random.default_rng(seed).standard_normal(out.shape)
    (out * minitorch.from_numpy(w.astype(np.float32), backend=backend)).sum().backward()
    base = [a.astype(np.float64) for a in arrays]
    for i, a in enumerate(base):
        num = np.zeros(a.shape, np.float64)
        for idx in np.ndindex(*a.shape):
            plus = [x.copy() for x in base]
            minus = [x.copy() for x in base]
            plus[i][idx] += EPS64
            minus[i][idx] -= EPS64
            num[idx] = (np.sum(ref(*plus) * w) - np.sum(ref(*minus) * w)) / (2 * EPS64)
        assert xs[i].grad is not None, f"no grad for input {i}"
        got = np_of(xs[i].grad).astype(np.float64)
        np.testing.assert_allclose(got, num, rtol=RTOL64, atol=1e-5 * max(1.0, np.abs(num).max()),
                                   err_msg=f"input {i}")


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


UNARY64 = {  # (ours, numpy float64 reference)
    "neg": (lambda x: -x, lambda x: -x), "exp": (lambda x: x.exp(), np.exp),
    "log": (lambda x: (x * x + 0.5).log(), lambda x: np.log(x * x + 0.5)),
    "sqrt": (lambda x: (x * x + 0.5).sqrt(), lambda x: np.sqrt(x * x + 0.5)),
    "rsqrt": (lambda x: (x * x + 0.5).rsqrt(), lambda x: 1.0 / np.sqrt(x * x + 0.5)),
    "sigmoid": (lambda x: x.sigmoid(), _sigmoid), "relu": (lambda x: x.relu(), lambda x: np.maximum(x, 0.0)),
    "silu": (lambda x: x.silu(), lambda x: x * _sigmoid(x)), "tanh": (lambda x: x.tanh(), np.tanh),
    "pow": (lambda x: x ** 3.0, lambda x: x ** 3.0),
}
BINARY64 = {
    "add": (lambda x, y: x + y, lambda x, y: x + y), "sub": (lambda x, y: x - y, lambda x, y: x - y),
    "mul": (lambda x, y: x * y, lambda x, y: x * y), "div": (lambda x, y: x / y, lambda x, y: x / y),
    "pow": (lambda x, y: (x * x + 0.5) ** y, lambda x, y: (x * x + 0.5) ** y),
    "where": (lambda x, y: minitorch.where(x > 0.0, x * 2.0, y), lambda x, y: np.where(x > 0, 2 * x, y)),
}


def _softmax64(x, d):
    e = np.exp(x - x.max(d, keepdims=True))
    return e / e.sum(d, keepdims=True)


def _rms64(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w


NN64 = {  # (ours, reference, inputs from a and a second array b of the same last dim)
    "softmax": (lambda x: nn.softmax(x, -1), lambda x: _softmax64(x, -1)),
    "log_softmax": (lambda x: nn.log_softmax(x, -1), lambda x: np.log(_softmax64(x, -1))),
    "silu_mul": (lambda x, u: nn.silu_mul(x, u), lambda x, u: x * _sigmoid(x) * u),
    "rmsnorm": (lambda x, w: nn.rmsnorm(x, w, 1e-6), _rms64),
    "sum-mean-max": (lambda x: x.sum(0) + x.mean(-1, True) + x.max(-1, True),
                     lambda x: x.sum(0) + x.mean(-1, keepdims=True) + x.max(-1, keepdims=True)),
    "matmul": (lambda x, y: x @ y.permute(1, 0), lambda x, y: x @ y.T),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(UNARY64))
@settings(max_examples=8)
@given(data=array_and_perm(lo=-2, hi=2))
def test_unary_grad_float64(backend, name, data):
    a, perm = data
    gradcheck64(backend, *UNARY64[name], [away_from_zero(a)], [perm])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(BINARY64))
@settings(max_examples=8)
@given(pair=broadcast_pair())
def test_binary_grad_float64(backend, name, pair):
    a, b = (away_from_zero(x) for x in pair)
    if name == "pow":
        b = np.clip(b, -2, 2)
    gradcheck64(backend, *BINARY64[name], [a, b])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(NN64))
def test_nn_grad_float64(backend, name):
    rng = np.random.default_rng(len(name))
    a = (rng.standard_normal((3, 5)) + np.linspace(-1, 1, 5)).astype(np.float32)  # distinct: max has no ties
    second = {"silu_mul": a[::-1].copy(), "rmsnorm": rng.standard_normal(5).astype(np.float32),
              "matmul": rng.standard_normal((4, 5)).astype(np.float32)}
    arrays = [a] + ([second[name]] if name in second else [])
    gradcheck64(backend, *NN64[name], arrays, [(1, 0)] + [None] * (len(arrays) - 1))


# one realistic slip per op: a backward 1% off (a wrong constant), caught by gradcheck64, missed by gradcheck
BROKEN_BACKWARD = ["Exp", "Log", "Sqrt", "Sigmoid", "Tanh", "Pow", "Div"]


@pytest.mark.parametrize("cls", BROKEN_BACKWARD)
def test_float64_gradcheck_catches_a_backward_off_by_one_percent(cls, monkeypatch):
    from minitorch import tensor_functions as tf

    fn_cls = getattr(tf, cls)
    real = fn_cls.backward

    def off(ctx, g):
        grads = real(ctx, g)
        return tuple(None if x is None else x * 1.01 for x in grads)

    monkeypatch.setattr(fn_cls, "backward", staticmethod(off))
    a = away_from_zero(np.random.default_rng(0).uniform(-2, 2, (2, 3)).astype(np.float32))
    if cls == "Div" or cls == "Pow":
        b = np.clip(away_from_zero(np.random.default_rng(1).uniform(-2, 2, (2, 3)).astype(np.float32)), -2, 2)
        ours, ref = BINARY64[cls.lower()]
        args = [a, b]
    else:
        ours, ref = UNARY64[cls.lower()]
        args = [a]
    with pytest.raises(AssertionError):
        gradcheck64(minitorch.SimpleBackend, ours, ref, args)
    gradcheck(minitorch.SimpleBackend, ours, args)  # the float32 check above lets the slip through
