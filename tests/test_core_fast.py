"""FastOps fast paths against the slow references: fused kernels vs SimpleOps compositions on
larger shapes, big-row softmax vs numpy, strided KV-cache attention, no weight copies in linear, and
a bound on per-op dispatch cost under no_grad."""
from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minitorch
from minitorch import FastBackend, SimpleBackend, nn
from backends import FAST_BACKENDS, make, np_of

TOL = dict(rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@settings(max_examples=15)
@given(rows=st.integers(1, 3), n=st.integers(1, 40), seed=st.integers(0, 999), scale=st.sampled_from([1.0, 30.0]))
def test_row_kernels_match_reference(backend, rows, n, seed, scale):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, n)) * scale).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    with minitorch.no_grad():
        for fn in (lambda B, X: nn.softmax(X, -1), lambda B, X: nn.log_softmax(X, -1),
                   lambda B, X: nn.softmax(X, 0),
                   lambda B, X: nn.rmsnorm(X, make(w, B), 1e-6),
                   lambda B, X: nn.layernorm(X, make(w, B), make(b, B), 1e-5),
                   lambda B, X: nn.silu_mul(X, make(x * 0.5, B)),
                   lambda B, X: X.sum(-1), lambda B, X: X.max(0), lambda B, X: X.argmax(-1)):
            fast = np_of(fn(backend, make(x, backend, (1, 0))))
            ref = np_of(fn(SimpleBackend, make(x, SimpleBackend)))
            np.testing.assert_allclose(fast, ref, rtol=1e-4, atol=1e-4 * scale)


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@settings(max_examples=10)
@given(hkv=st.integers(1, 2), g=st.sampled_from([1, 2, 6]), t=st.integers(1, 5), past=st.integers(0, 9),
       d=st.sampled_from([4, 16]), seed=st.integers(0, 999))
def test_attention_prefill_and_decode_vs_reference(backend, hkv, g, t, past, d, seed):
    rng = np.random.default_rng(seed)
    max_len = past + t + 4
    kc = rng.standard_normal((1, hkv, max_len, d)).astype(np.float32)
    vc = rng.standard_normal((1, hkv, max_len, d)).astype(np.float32)
    q = rng.standard_normal((1, hkv * g, t, d)).astype(np.float32)
    with minitorch.no_grad():
        fast = nn.attention(make(q, backend, (0, 2, 1, 3)), make(kc, backend).narrow(2, 0, past + t),
                            make(vc, backend).narrow(2, 0, past + t), None, past)
        ref = nn.attention(make(q, SimpleBackend), make(kc[:, :, :past + t].copy(), SimpleBackend),
                           make(vc[:, :, :past + t].copy(), SimpleBackend), None, past)
    np.testing.assert_allclose(np_of(fast), np_of(ref), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@given(t=st.integers(1, 3), h=st.integers(1, 3), half=st.integers(1, 8), seed=st.integers(0, 999))
def test_rope_and_embedding_vs_reference(backend, t, h, half, seed):
    rng = np.random.default_rng(seed)
    d = 2 * half
    x = rng.standard_normal((1, h, t, d)).astype(np.float32)
    cos, sin = rng.standard_normal((t, d)).astype(np.float32), rng.standard_normal((t, d)).astype(np.float32)
    w = rng.standard_normal((7, d)).astype(np.float32)
    ids = rng.integers(0, 7, (2, t))
    with minitorch.no_grad():
        for B, perm in ((backend, (0, 2, 1, 3)), (SimpleBackend, None)):
            r = np_of(nn.rope(make(x, B, perm), make(cos, B), make(sin, B)))
            e = np_of(nn.embedding(make(w, B), minitorch.from_numpy(ids, backend=B)))
            if B is backend:
                fast = (r, e)
    np.testing.assert_allclose(fast[0], r, **TOL)
    np.testing.assert_array_equal(fast[1], e)


def test_parallel_attention_path_matches_serial(monkeypatch):
    """Prefill-sized work takes the prange kernel; force it on a small case and compare."""
    from minitorch.cpu import ops as fast_ops
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 6, 4, 8)).astype(np.float32)
    k = rng.standard_normal((2, 3, 6, 8)).astype(np.float32)
    v = rng.standard_normal((2, 3, 6, 8)).astype(np.float32)
    with minitorch.no_grad():
        serial = np_of(nn.attention(make(q, FastBackend), make(k, FastBackend), make(v, FastBackend), None, 2))
        monkeypatch.setattr(fast_ops, "PARALLEL_ATTENTION_WORK", 0)
        par = np_of(nn.attention(make(q, FastBackend), make(k, FastBackend), make(v, FastBackend), None, 2))
        ref = np_of(nn.attention(make(q, SimpleBackend), make(k, SimpleBackend), make(v, SimpleBackend), None, 2))
    np.testing.assert_allclose(par, serial, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(par, ref, rtol=1e-4, atol=1e-5)


def test_big_row_softmax_matches_numpy():
    x = (np.random.default_rng(0).standard_normal((1, 151936)) * 10).astype(np.float32)
    with minitorch.no_grad():
        out = np_of(nn.softmax(make(x, FastBackend), -1))
        lout = np_of(nn.log_softmax(make(x, FastBackend), -1))
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max())
    np.testing.assert_allclose(out, e / e.sum(), rtol=1e-4, atol=1e-9)
    np.testing.assert_allclose(lout, np.log(e / e.sum()), rtol=1e-4, atol=1e-4)


def test_linear_with_transposed_weight_does_not_copy_weight():
    w = np.random.default_rng(0).standard_normal((2048, 1024)).astype(np.float32)   # (out, in): 8 MiB
    x = np.ones((1, 1, 1024), np.float32)
    tw, tx = minitorch.from_numpy(w, backend=FastBackend), minitorch.from_numpy(x, backend=FastBackend)
    with minitorch.no_grad():
        nn.linear(tx, tw)                       # warm up
        tracemalloc.start()
        y = nn.linear(tx, tw)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < 1 << 20, f"linear allocated {peak} bytes (weight is {w.nbytes})"
    np.testing.assert_allclose(np_of(y), x @ w.T, rtol=1e-4, atol=1e-3)


def test_dispatch_cost_under_no_grad():
    a = minitorch.from_numpy(np.ones((1, 16), np.float32), backend=FastBackend)
    with minitorch.no_grad():
        for _ in range(50):
            a + a
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(200):
                a + a
                a * 2.0
                a.view(4, 4)
            times.append((time.perf_counter() - t0) / 600)
    # tens of microseconds is the budget; allow slack for a loaded 2-core CI machine
    assert min(times) < 100e-6, f"per-op dispatch {min(times) * 1e6:.1f} us"


@pytest.mark.parametrize("backend", FAST_BACKENDS + [pytest.param(SimpleBackend, id="simple")])
def test_softmax_of_masked_logits_is_exactly_zero(backend):
    x = make(np.array([[1.0, 2.0, 3.0, 4.0]], np.float32), backend)
    mask = make(np.array([[0.0, 1.0, 0.0, 1.0]], np.float32), backend)
    with minitorch.no_grad():
        p = np_of(nn.softmax(x.masked_fill(mask, float("-inf")), -1))
        lp = np_of(nn.log_softmax(x.masked_fill(mask, float("-inf")), -1))
    assert p[0, 1] == 0.0 and p[0, 3] == 0.0
    np.testing.assert_allclose(p.sum(), 1.0, rtol=1e-6)
    np.testing.assert_allclose(p[0, [0, 2]], np.exp([1.0, 3.0]) / np.exp([1.0, 3.0]).sum(), rtol=1e-6)
    assert np.isneginf(lp[0, 1]) and np.isneginf(lp[0, 3])


def test_numba_cache_makes_second_start_compile_nothing(tmp_path):
    """cache=True: a second process loads the compiled kernels from the cache instead of compiling."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    code = ("import numpy as np, minitorch\n"
            "from minitorch import nn\nfrom minitorch.cpu import kernels as fk, fused as ff\n"
            "x = minitorch.from_numpy(np.ones((2, 8), np.float32))\n"
            "with minitorch.no_grad():\n"
            "    (x + x).exp(); nn.softmax(x, -1)\n"
            "fns = [fk.zip_flat, fk.map_flat, ff.softmax_rows]\n"
            "print(sum(len(f.stats.cache_hits) for f in fns), sum(len(f.stats.cache_misses) for f in fns))\n")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), PYTHONPATH=str(root))
    runs = [subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                           timeout=300) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    hits0, misses0 = map(int, runs[0].stdout.split())
    hits1, misses1 = map(int, runs[1].stdout.split())
    assert misses0 == 3 and hits0 == 0
    assert hits1 == 3 and misses1 == 0


# ---- skinny matmul (few rows against an (out, in) weight; minitorch/cpu/matmul.py) ----
@settings(max_examples=40, deadline=None)
@given(batch=st.sampled_from([(), (1,), (2,), (1, 3)]), t=st.integers(1, 20), k=st.integers(1, 70),
       n=st.integers(1, 50), seed=st.integers(0, 999), x_perm=st.booleans(), w_layout=st.sampled_from(["oi", "io"]))
def test_skinny_matmul_matches_reference(batch, t, k, n, seed, x_perm, w_layout):
    """FastOps matmul (skinny kernel or BLAS) vs SimpleOps and numpy, incl. permuted activations and both
    weight layouts: (out, in) used as a transposed view, and (in, out) row-major."""
    from minitorch.cpu import matmul as fm
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(batch + (t, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)  # (out, in)
    perm = tuple(range(len(batch))) + (len(batch) + 1, len(batch)) if x_perm else None
    tx = make(x, FastBackend, perm)
    tw = make(w, FastBackend).permute(1, 0) if w_layout == "oi" else make(w.T, FastBackend)  # (in, out)
    oi_like = w_layout == "oi" or k == 1 or n == 1  # a 1-wide weight is both layouts at once
    assert fm.use_skinny(tx.to_numpy(), tw.to_numpy()) == (oi_like and 1 <= t * int(np.prod(batch)) <= 16)
    with minitorch.no_grad():
        fast = np_of(tx @ tw)
        ref = np_of(make(x, SimpleBackend) @ make(w.T, SimpleBackend))
    np.testing.assert_allclose(fast, x @ w.T, rtol=1e-5, atol=1e-5 * np.sqrt(k))
    np.testing.assert_allclose(fast, ref, rtol=1e-5, atol=1e-5 * np.sqrt(k))


def test_skinny_matmul_takes_kernel_for_linear_and_writes_strided_out(monkeypatch):
    from minitorch.cpu import matmul as fm
    calls = []
    real = fm.skinny_matmul
    monkeypatch.setattr(fm, "skinny_matmul", lambda *a: (calls.append(1), real(*a))[1])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 5, 96)).astype(np.float32)
    w = rng.standard_normal((80, 96)).astype(np.float32)
    with minitorch.no_grad():
        y = nn.linear(make(x, FastBackend), make(w, FastBackend))
        assert calls, "nn.linear with 5 rows did not take the skinny kernel"
        np.testing.assert_allclose(np_of(y), x @ w.T, rtol=1e-5, atol=1e-4)
        out = make(np.zeros((80, 5), np.float32), FastBackend).permute(1, 0)  # (5, 80), non-contiguous
        FastBackend.matrix_multiply(make(x[0], FastBackend), make(w, FastBackend).permute(1, 0), out)
        np.testing.assert_allclose(np_of(out), x[0] @ w.T, rtol=1e-5, atol=1e-4)


def ieee_matmul_nt(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ w.T by its definition, sum_k x[t, k] * w[n, k] in float64, no BLAS: IEEE propagation of inf/nan
    (nan in -> nan; inf * 0 -> nan; inf + -inf -> nan; else +-inf). numpy's `x @ w.T` is no reference for
    this: OpenBLAS kernels may turn an inf row into nan depending on their path (a flaky test here)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return (x.astype(np.float64)[:, None, :] * w.astype(np.float64)[None, :, :]).sum(-1)


def _check_skinny_inf_nan(skinny) -> None:
    x = np.ones((4, 5), np.float32)
    x[0, 1], x[1, 2], x[2, 0], x[2, 3] = np.inf, np.nan, np.inf, -np.inf
    w = np.ones((7, 5), np.float32)
    w[3, 1] = 0.0  # inf * 0 = nan in out[0, 3]
    w[5, 1] = -1.0  # row 0 against w[5]: -inf
    x[3] = np.arange(5, dtype=np.float32)  # a finite row stays finite
    out = np.empty((4, 7), np.float32)
    skinny(x, w.T, out)
    ref = ieee_matmul_nt(x, w)
    assert np.isnan(ref[0, 3]) and ref[0, 5] == -np.inf and np.isnan(ref[1]).all() and np.isnan(ref[2]).all()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_array_equal(out[~np.isnan(ref)], ref[~np.isnan(ref)].astype(np.float32))


def test_skinny_matmul_propagates_inf_nan_and_row_rules():
    from minitorch.cpu import matmul as fm
    _check_skinny_inf_nan(fm.skinny_matmul)
    x, w = np.ones((3, 4), np.float32), np.ones((6, 4), np.float32)
    assert not fm.use_skinny(x.astype(np.float64), w.T.astype(np.float64))
    assert not fm.use_skinny(np.ones((17, 4), np.float32), w.T)
    assert [fm.use_skinny(np.ones((r, 4), np.float32), w.T) for r in (1, 2, 16)] == [True, True, True]
    assert not fm.use_skinny(np.ones((2, 4), np.float32), np.ones((4, 6), np.float32))  # row-major (K, N) weight


@pytest.mark.parametrize("bug", ["nnan-ninf", "inf-becomes-nan"])
def test_inf_nan_check_catches_a_kernel_that_drops_them(bug):
    """The check above fails on a kernel compiled with fastmath's no-nan/no-inf flags replaced by its effect
    (non-finite sums flushed to 0) or one whose inf rows come out as nan (what OpenBLAS sometimes does)."""
    from minitorch.cpu import matmul as fm

    def broken(a, b, out):
        fm.skinny_matmul(a, b, out)
        if bug == "nnan-ninf":
            out[~np.isfinite(out)] = 0.0
        else:
            out[np.isinf(out)] = np.nan
    with pytest.raises(AssertionError):
        _check_skinny_inf_nan(broken)


@pytest.mark.parametrize("n_out", [4, 7, 13])
def test_skinny_rows_are_bitwise_independent_of_row_count(n_out):
    """Row t of a T-row product is bit for bit the 1-row product of that row (what makes a verify pass
    reproduce the decode steps' logits), including the 1-3 tail rows of an N not divisible by 4."""
    from minitorch.cpu import matmul as fm
    rng = np.random.default_rng(n_out)
    w = rng.standard_normal((n_out, 67)).astype(np.float32)
    x = rng.standard_normal((6, 67)).astype(np.float32)
    many = np.empty((6, n_out), np.float32)
    fm.skinny_matmul(x, w.T, many)
    np.testing.assert_allclose(many, x @ w.T, rtol=1e-5, atol=1e-5)
    for t in range(6):
        one = np.empty((1, n_out), np.float32)
        fm.skinny_matmul(x[t:t + 1], w.T, one)
        assert np.array_equal(one[0], many[t]), f"row {t} differs between a 1-row and a 6-row product"


def _fused_attention(kernel, q, kc, vc, q_start, length):
    """One call of a fused attention kernel as the CPU decoder makes it: q (Hq, T, D), caches (Hkv, max_len, D)."""
    from minitorch.cpu import fused as ff

    hq, t, d = q.shape
    o = np.empty((hq, t, d), dtype=np.float32)
    ks = np.array((0,) + tuple(s // 4 for s in kc.strides), np.int64)
    vs = np.array((0,) + tuple(s // 4 for s in vc.strides), np.int64)
    qs = np.array((q.size, t * d, d, 1), np.int64)
    kernel(o.reshape(-1), np.ascontiguousarray(q).reshape(-1), qs, kc.reshape(-1), ks, vc.reshape(-1), vs, 1, hq,
           kc.shape[0], t, d, length, np.float32(d ** -0.5), int(q_start), ff.NO_MASK, 0)
    return o


@pytest.mark.parametrize("t_len", [2, 5, 16, 17])
def test_verify_rows_are_one_row_steps_bit_for_bit(t_len):
    """A causal step of T query rows over a cache (a verify step) gives every row the bits of a one-row step at its
    position (what makes the CPU's verify rows a decode step's), in the serial and the threaded kernel; rows that
    see one key too many are caught; the rows agree with a float64 numpy attention. (Reading each K/V row once for
    all T rows instead of once a row was tried and measured no faster at 100-800 tokens of context.)"""
    from minitorch.cpu import fused as ff

    rng = np.random.default_rng(t_len)
    hq, hkv, d, past = 12, 2, 128, 300
    kc = rng.standard_normal((hkv, past + t_len + 8, d)).astype(np.float32)
    vc = rng.standard_normal((hkv, past + t_len + 8, d)).astype(np.float32)
    q = rng.standard_normal((hq, t_len, d)).astype(np.float32)
    ones = np.concatenate([_fused_attention(ff.attention_serial, q[:, t:t + 1], kc, vc, past + t, past + t + 1)
                           for t in range(t_len)], axis=1)
    for kernel in (ff.attention_serial, ff.attention_parallel):
        np.testing.assert_array_equal(_fused_attention(kernel, q, kc, vc, past, past + t_len), ones)
    late = _fused_attention(ff.attention_serial, q, kc, vc, past + 1, past + t_len + 1)  # each row one key more
    assert not np.array_equal(late, ones)
    g = hq // hkv
    k64, v64 = kc.astype(np.float64), vc.astype(np.float64)
    for t in range(t_len):
        n = past + t + 1
        s = np.einsum("hd,hnd->hn", q[:, t].astype(np.float64), np.repeat(k64[:, :n], g, axis=0)) * d ** -0.5
        p = np.exp(s - s.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        np.testing.assert_allclose(ones[:, t], np.einsum("hn,hnd->hd", p, np.repeat(v64[:, :n], g, axis=0)),
                                   rtol=1e-4, atol=1e-5)
