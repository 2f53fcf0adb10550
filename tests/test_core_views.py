"""Views share storage, from_numpy/to_numpy do not copy, copy_ writes through strided views,
and no_grad records nothing."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import minitorch
from backends import BACKENDS, array_and_perm, make, np_of


def shares(t: minitorch.Tensor, arr: np.ndarray) -> bool:
    return np.shares_memory(t.to_numpy(), arr)


@pytest.mark.parametrize("backend", BACKENDS)
def test_from_numpy_and_to_numpy_share_memory(backend):
    if backend.cuda:
        pytest.skip("device memory")
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = minitorch.from_numpy(a, backend=backend)
    assert shares(t, a) and t.to_numpy().base is not None
    a[0, 0, 0] = 100.0
    assert t[0, 0, 0].item() == 100.0
    tr = minitorch.from_numpy(a.transpose(2, 0, 1), backend=backend)   # strided input: still no copy
    assert shares(tr, a) and not tr.is_contiguous()
    np.testing.assert_array_equal(np_of(tr), a.transpose(2, 0, 1))
    sl = minitorch.from_numpy(a[:, 1:, ::2], backend=backend)
    assert shares(sl, a)
    np.testing.assert_array_equal(np_of(sl), a[:, 1:, ::2])
    ids = minitorch.from_numpy(np.array([1, 2], dtype=np.int64), backend=backend)
    assert ids.dtype == "int64"
    assert minitorch.from_numpy(np.array([1.5]), backend=backend).dtype == "float32"  # float64 converted


@pytest.mark.parametrize("backend", BACKENDS)
@given(data=array_and_perm())
def test_views_share_storage_and_values(backend, data):
    a, perm = data
    t = make(a, backend, perm)
    n = a.ndim
    p = list(reversed(range(n)))
    np.testing.assert_array_equal(np_of(t.permute(*p)), a.transpose(p))
    np.testing.assert_array_equal(np_of(t.transpose(0, -1)), np.swapaxes(a, 0, -1))
    np.testing.assert_array_equal(np_of(t.reshape(-1)), a.reshape(-1))
    np.testing.assert_array_equal(np_of(t.contiguous().view(a.size)), a.reshape(-1))
    np.testing.assert_array_equal(np_of(t.unsqueeze(0).squeeze(0)), a)
    np.testing.assert_array_equal(np_of(t.expand(2, *a.shape)), np.broadcast_to(a, (2,) + a.shape))
    if a.shape[0] > 1:
        np.testing.assert_array_equal(np_of(t.narrow(0, 1, a.shape[0] - 1)), a[1:])
        np.testing.assert_array_equal(np_of(t[1:]), a[1:])
    np.testing.assert_array_equal(np_of(t[0]), a[0])
    np.testing.assert_array_equal(np_of(t[..., -1]), a[..., -1])
    v = t.permute(*p)
    assert v._tensor.storage is t._tensor.storage or np.shares_memory(v._tensor.storage, t._tensor.storage)


@pytest.mark.parametrize("backend", BACKENDS)
def test_view_requires_contiguous(backend):
    t = minitorch.zeros((2, 3), backend=backend).permute(1, 0)
    with pytest.raises(minitorch.MiniTorchError, match=r"\(3, 2\)"):
        t.view(6)
    assert t.reshape(6).shape == (6,)


@pytest.mark.parametrize("backend", BACKENDS)
@given(start=st.integers(0, 5), length=st.integers(1, 3), bcast=st.booleans())
def test_copy_into_strided_cache_view(backend, start, length, bcast):
    cache = minitorch.zeros((1, 2, 8, 4), backend=backend)           # (B, Hkv, max_len, D)
    src = np.arange(2 * length * 4, dtype=np.float32).reshape(1, 2, length, 4)
    view = cache.narrow(2, start, length)
    if bcast:
        view.copy_(make(src[:, :1], backend))
        src = np.broadcast_to(src[:, :1], src.shape)
    else:
        view.copy_(make(src.transpose(0, 2, 1, 3).copy(), backend).permute(0, 2, 1, 3))
    expect = np.zeros((1, 2, 8, 4), np.float32)
    expect[:, :, start:start + length] = src
    np.testing.assert_array_equal(np_of(cache), expect)
    cache[0, 1, 0] = 7.0
    assert np_of(cache)[0, 1, 0].tolist() == [7.0] * 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_argument_and_cast(backend):
    a = make(np.array([1.0, 2.0], np.float32), backend)
    out = minitorch.zeros((2,), backend=backend)
    r = backend.add_zip(a, a, out=out)
    assert r is out and np_of(out).tolist() == [2.0, 4.0]
    ints = a.to("int64")
    assert ints.dtype == "int64" and np_of(ints).tolist() == [1, 2]


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_grad_records_nothing(backend):
    x = minitorch.tensor([1.0, 2.0], backend=backend, requires_grad=True)
    with minitorch.no_grad():
        assert not minitorch.is_grad_enabled()
        y = (x * x).sum()
        assert y.history is None and not y.requires_grad
    assert minitorch.is_grad_enabled()
    z = (x * x).sum()
    assert z.history is not None
    w = x.detach() * 2
    assert w.history is None

    @minitorch.no_grad()
    def f(t):
        return t * 3

    assert f(x).history is None


def test_creation_helpers():
    for backend in (minitorch.SimpleBackend, minitorch.FastBackend):
        assert np_of(minitorch.ones((2, 2), backend=backend)).sum() == 4
        assert np_of(minitorch.full((3,), 2.5, backend=backend)).tolist() == [2.5] * 3
        assert np_of(minitorch.arange(4, backend=backend)).tolist() == [0, 1, 2, 3]
        s = minitorch.tensor(3.0, backend=backend)
        assert s.shape == () and s.item() == 3.0
        assert minitorch.to_backend(s, minitorch.SimpleBackend).backend is minitorch.SimpleBackend


def test_iteration_and_derived_comparisons():
    t = minitorch.tensor([[1.0, 2.0], [3.0, 4.0]])
    rows = [np_of(r).tolist() for r in t]
    assert rows == [[1.0, 2.0], [3.0, 4.0]]
    assert np_of(t != 2.0).tolist() == [[1, 0], [1, 1]]
    assert np_of(t <= 2.0).tolist() == [[1, 1], [0, 0]]
    assert np_of(t >= 3.0).tolist() == [[0, 0], [1, 1]]
