"""Every kernel in kernels/*.cu against a float64 numpy reference, on fresh random inputs of many
shapes (odd sizes, long rows, permuted / broadcast views). GPU only (marked `gpu`)."""
from __future__ import annotations

import numpy as np
import pytest

from cuda_helpers import down, needs_gpu, ref_in, tol, up

pytestmark = [pytest.mark.gpu, needs_gpu]

DTYPES = ["float32", "bfloat16"]
SHAPES = [(1,), (7,), (3, 5), (2, 3, 4), (33, 65), (4, 1, 7, 3), (1000, 3), (2, 70000)]


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def permuted(x, dtype):
    """An uploaded, transposed (non-contiguous) view with the logical values x."""
    from minitorch.cuda.launch import View

    if x.ndim < 2:
        return up(x, dtype), x
    v = up(np.ascontiguousarray(x.swapaxes(0, -1)), dtype)  # stored transposed
    order = list(range(x.ndim))
    order[0], order[-1] = order[-1], order[0]
    return View(v.storage, tuple(v.shape[i] for i in order), tuple(v.strides[i] for i in order), dtype), x


MAP_REF = {
    "id": lambda x: x, "neg": lambda x: -x, "inv": lambda x: 1 / x, "exp": np.exp, "log": np.log,
    "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "relu": lambda x: np.maximum(x, 0), "silu": lambda x: x / (1 + np.exp(-x)), "tanh": np.tanh,
    "abs": np.abs, "square": lambda x: x * x,
}
POSITIVE = {"log", "sqrt", "rsqrt", "inv"}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", sorted(MAP_REF))
def test_map(op, dtype):
    from minitorch.cuda.launch import empty, map_op

    for i, shape in enumerate(SHAPES):
        x = rng(i).standard_normal(shape).astype(np.float32)
        if op in POSITIVE:
            x = np.abs(x) + 0.5
        a, _ = permuted(x, dtype)
        out = empty(shape, dtype)
        map_op(op, a, out)
        np.testing.assert_allclose(down(out), MAP_REF[op](ref_in(x, dtype)), **tol(dtype), err_msg=f"{op} {shape}")


ZIP_REF = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "max": np.maximum,
    "min": np.minimum, "lt": lambda a, b: (a < b) * 1.0, "gt": lambda a, b: (a > b) * 1.0,
    "eq": lambda a, b: (a == b) * 1.0, "pow": lambda a, b: np.abs(a) ** b,
}
BCAST = [((3, 5), (3, 5)), ((3, 5), (5,)), ((4, 1, 6), (1, 7, 1)), ((1,), (9, 2)), ((257, 33), (257, 1)),
         ((2, 3, 4, 5), (3, 1, 5))]


@pytest.mark.parametrize("dtype", DTYPES + ["int64"])
@pytest.mark.parametrize("op", sorted(ZIP_REF))
def test_zip(op, dtype):
    from minitorch.cuda.launch import empty, zip_op

    if dtype == "int64" and op in ("div", "pow"):
        pytest.skip("integer div/pow are not core ops")
    for i, (sa, sb) in enumerate(BCAST):
        r = rng(100 + i)
        if dtype == "int64":
            x, y = r.integers(-5, 5, sa), r.integers(-5, 5, sb)
        else:
            x, y = r.standard_normal(sa).astype(np.float32), r.standard_normal(sb).astype(np.float32)
            if op == "pow":
                x = np.abs(x) + 0.1
            if op == "eq":  # small integers so that equal pairs occur
                x, y = np.round(x), np.round(y)
        a, _ = permuted(x, dtype)
        b = up(y, dtype)
        oshape = np.broadcast_shapes(sa, sb)
        odt = "float32" if op in ("lt", "gt", "eq") and dtype != "float32" else dtype
        out = empty(oshape, odt)
        zip_op(op, a, b, out)
        ref = ZIP_REF[op](ref_in(x, dtype), ref_in(y, dtype)) if dtype != "int64" else ZIP_REF[op](x, y)
        t = tol(dtype) if dtype != "int64" else dict(rtol=0, atol=0)
        np.testing.assert_allclose(down(out), ref, **t, err_msg=f"{op} {sa} {sb}")


@pytest.mark.parametrize("src", DTYPES + ["int64"])
@pytest.mark.parametrize("dst", DTYPES + ["int64"])
def test_cast_into_strided_view(src, dst):
    from minitorch.cuda.launch import View, cast, fill, empty

    x = rng(7).integers(-100, 100, (5, 6, 7)).astype(np.float32)
    a, _ = permuted(x, src) if src != "int64" else (up(x.astype(np.int64), "int64"), x)
    big = empty((5, 10, 7), dst)
    fill(big, -1)
    window = View(big.storage[2 * 7:], (5, 6, 7), big.strides, dst)  # big[:, 2:8, :]
    cast(a, window)
    got = down(big)
    np.testing.assert_array_equal(got[:, 2:8, :], x)
    assert (got[:, :2, :] == -1).all() and (got[:, 8:, :] == -1).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "max", "min", "prod"])
def test_reduce(op, dtype):
    from minitorch.cuda.launch import empty, reduce

    ref = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}[op]
    for i, shape in enumerate([(7,), (3, 5), (2, 3, 4), (4, 5000), (3000, 3), (1, 100001), (3, 40000, 2),
                               (2, 65536)]):
        x = rng(200 + i).standard_normal(shape).astype(np.float32)
        if op == "prod":
            x = 1 + 0.01 * x
        a, _ = permuted(x, dtype)
        for dim in range(len(shape)):
            oshape = tuple(1 if d == dim else s for d, s in enumerate(shape))
            out = empty(oshape, dtype)
            reduce(op, a, dim, out)
            want = ref(ref_in(x, dtype), axis=dim, keepdims=True)
            t = tol(dtype) if op != "sum" else dict(rtol=1e-4 if dtype == "float32" else 2e-2,
                                                    atol=1e-3 * np.sqrt(shape[dim]))
            np.testing.assert_allclose(down(out), want, **t, err_msg=f"{op} {shape} dim {dim}")


def test_reduce_two_pass(monkeypatch):
    """Few outputs over a long float32 dim run in two passes (launch._reduce_two_pass): counts of ones come out
    exact (remainder or none, the dim inner or outer), and a mean over 2^21 elements equals float64's, as the
    one-block kernel gives it."""
    from minitorch.cuda import launch
    from minitorch.cuda.launch import empty, reduce

    calls = []
    real = launch._reduce_two_pass
    monkeypatch.setattr(launch, "_reduce_two_pass", lambda *a: (calls.append(a[-1]), real(*a)))
    for shape, dim in [((1, 100001), 1), ((65536 * 2,), 0), ((40001, 3), 0), ((2, 50000, 3), 1)]:
        a = up(np.ones(shape, np.float32), "float32")
        out = empty(tuple(1 if d == dim else s for d, s in enumerate(shape)), "float32")
        reduce("sum", a, dim, out)
        assert (down(out) == shape[dim]).all(), (shape, dim, down(out).ravel()[:4])
    assert calls == [100001, 131072, 40001, 50000]
    x = rng(7).standard_normal(1 << 21).astype(np.float32)
    out = empty((1,), "float32")
    reduce("sum", up(x, "float32"), 0, out)
    np.testing.assert_allclose(down(out)[0], x.astype(np.float64).sum(), rtol=0, atol=0.05)
    monkeypatch.setattr(launch, "REDUCE_TWO_PASS", 1 << 40)  # the one-block kernel, for comparison
    one = empty((1,), "float32")
    reduce("sum", up(x, "float32"), 0, one)
    np.testing.assert_allclose(down(out)[0], down(one)[0], rtol=0, atol=0.05)


@pytest.mark.parametrize("dtype", DTYPES)
def test_argmax(dtype):
    from minitorch.cuda.launch import argmax_rows, empty

    for i, (rows, n) in enumerate([(1, 1), (3, 17), (5, 1025), (2, 152064), (9, 151936)]):
        x = rng(300 + i).standard_normal((rows, n)).astype(np.float32)
        x[0, n // 2] = 50.0  # a clear winner in row 0
        if rows > 2 and n > 3:
            x[1, 3] = x[1, n - 1] = 60.0  # a tie: the lowest index wins
            x[2, n - 2] = np.nan  # NaN wins, as in numpy
        xv = up(x, dtype)
        out = empty((rows,), "int64")
        argmax_rows(xv, out)
        np.testing.assert_array_equal(down(out).astype(np.int64), np.argmax(ref_in(x, dtype), axis=-1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log", [False, True])
def test_softmax_any_row_length(dtype, log):
    from minitorch.cuda.launch import empty, softmax

    for i, (rows, n) in enumerate([(1, 1), (4, 7), (3, 1000), (2, 1025), (5, 4097), (2, 152064), (70, 33)]):
        x = (3 * rng(400 + i).standard_normal((rows, n))).astype(np.float32)
        if n > 1:
            x[0, 0] = -np.inf
        xv = up(x, dtype)
        out = empty((rows, n), dtype)
        softmax(xv, out, log=log)
        xr = ref_in(x, dtype)
        lse = np.log(np.sum(np.exp(xr - xr.max(-1, keepdims=True)), -1, keepdims=True)) + xr.max(-1, keepdims=True)
        want = xr - lse if log else np.exp(xr - lse)
        got = down(out)
        if log:
            finite = np.isfinite(want)
            assert (got[~finite] == -np.inf).all()
            np.testing.assert_allclose(got[finite], want[finite], rtol=tol(dtype)["rtol"], atol=5 * tol(dtype)["atol"])
        else:
            np.testing.assert_allclose(got, want, rtol=tol(dtype)["rtol"], atol=1e-6 if dtype == "float32" else 2e-3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_layernorm(dtype):
    from minitorch.cuda.launch import add_rmsnorm, empty, layernorm, rmsnorm

    for i, (rows, n) in enumerate([(1, 1), (3, 7), (5, 1536), (2, 3584), (3, 5000), (64, 129)]):
        r = rng(500 + i)
        x = (r.standard_normal((rows, n)) * 3 + 1).astype(np.float32)
        w = r.standard_normal(n).astype(np.float32)
        b = r.standard_normal(n).astype(np.float32)
        xr, wr, br = ref_in(x, dtype), ref_in(w, dtype), ref_in(b, dtype)
        out = empty((rows, n), dtype)
        rmsnorm(up(x, dtype), up(w, dtype), out, 1e-6)
        want = xr / np.sqrt(np.mean(xr ** 2, -1, keepdims=True) + 1e-6) * wr
        np.testing.assert_allclose(down(out), want, **tol(dtype), err_msg=f"rmsnorm {rows}x{n}")
        layernorm(up(x, dtype), up(w, dtype), up(b, dtype), out, 1e-5)
        mu = xr.mean(-1, keepdims=True)
        want = (xr - mu) / np.sqrt(((xr - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * wr + br
        np.testing.assert_allclose(down(out), want, rtol=tol(dtype)["rtol"], atol=5 * tol(dtype)["atol"])
        resid = up(x, "float32")
        d = r.standard_normal((rows, n)).astype(np.float32)
        add_rmsnorm(resid, up(d, dtype), up(w, dtype), out, 1e-6)
        h = x.astype(np.float64) + ref_in(d, dtype)
        np.testing.assert_allclose(down(resid), h, rtol=1e-6, atol=1e-6)
        want = h / np.sqrt(np.mean(h ** 2, -1, keepdims=True) + 1e-6) * wr
        np.testing.assert_allclose(down(out), want, **tol(dtype))


def rope_ref(x, cos, sin):
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope(dtype):
    from minitorch.cuda.launch import empty, rope

    for i, (B, H, T, D) in enumerate([(1, 1, 1, 2), (1, 3, 5, 64), (2, 7, 11, 128), (1, 2, 300, 80)]):
        r = rng(600 + i)
        x = r.standard_normal((B, H, T, D)).astype(np.float32)
        ang = r.uniform(-10, 10, (T, D // 2))
        cos = np.cos(np.concatenate([ang, ang], -1)).astype(np.float32)
        sin = np.sin(np.concatenate([ang, ang], -1)).astype(np.float32)
        xv = up(x, dtype)
        out = empty(x.shape, dtype)
        rope(xv, up(cos, dtype), up(sin, dtype), out)
        want = rope_ref(ref_in(x, dtype), ref_in(cos, dtype), ref_in(sin, dtype))
        np.testing.assert_allclose(down(out), want, **tol(dtype))
        rope(xv, up(cos, dtype), up(sin, dtype), xv)  # in place
        np.testing.assert_allclose(down(xv), want, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_and_silu_mul(dtype):
    from minitorch.cuda.launch import embedding, empty, gate_up_silu, silu_mul

    r = rng(700)
    for V, D, n in [(11, 3, 1), (1000, 129, 37), (151936, 64, 5)]:
        w = r.standard_normal((V, D)).astype(np.float32)
        ids = r.integers(0, V, n)
        out = empty((n, D), dtype)
        embedding(up(w, dtype), up(ids, "int64"), out)
        np.testing.assert_array_equal(down(out), ref_in(w, dtype)[ids])
        out32 = empty((n, D), "float32")
        embedding(up(w, dtype), up(ids, "int64"), out32)
        np.testing.assert_array_equal(down(out32), ref_in(w, dtype)[ids])
    for shape in [(1,), (7, 3), (5, 8960), (3, 18944)]:
        g, u = r.standard_normal(shape).astype(np.float32), r.standard_normal(shape).astype(np.float32)
        out = empty(shape, dtype)
        silu_mul(up(g, dtype), up(u, dtype), out)
        gr, ur = ref_in(g, dtype), ref_in(u, dtype)
        want = gr / (1 + np.exp(-gr)) * ur
        np.testing.assert_allclose(down(out), want, **tol(dtype))
        if len(shape) == 2:
            gu = np.concatenate([g, u], -1)
            out2 = empty(shape, dtype)
            gate_up_silu(up(gu, dtype), out2)
            np.testing.assert_allclose(down(out2), want, **tol(dtype))
            if dtype == "bfloat16":  # interleaved rows [g0, u0, g1, u1, ...] (the decoder's layout)
                import cupy as cp

                from minitorch.cuda.runtime import kernels

                gil = up(np.stack([g, u], -1).reshape(shape[0], 2 * shape[1]), dtype)
                out3 = empty(shape, dtype)
                kernels().launch("gate_up_silu_il_bf16", (8,), (256,),
                                 (gil.storage, out3.storage, np.int64(shape[0]), np.int32(shape[1])))
                cp.cuda.get_current_stream().synchronize()
                np.testing.assert_array_equal(down(out3), down(out2))
