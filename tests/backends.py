"""Backend lists and hypothesis strategies shared by the core tests.

BACKENDS holds every CPU backend; a CUDA backend joins (marked `gpu`) when CuPy sees a GPU.
`make(arr, backend, perm)` builds a tensor with the given values whose strides follow `perm`, so
the same check runs on contiguous and permuted (non-contiguous) inputs.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np
import pytest
from hypothesis import strategies as st

import minitorch
from minitorch import FastBackend, SimpleBackend


def _gpu_backends() -> List:
    try:  # the CUDA issue provides make_cuda_backend(); absent or no GPU -> no GPU params
        from minitorch.cuda.ops import make_cuda_backend  # type: ignore
        return [pytest.param(make_cuda_backend(), id="cuda", marks=pytest.mark.gpu)]
    except Exception:
        return []


BACKENDS = [pytest.param(SimpleBackend, id="simple"), pytest.param(FastBackend, id="fast")] + _gpu_backends()
FAST_BACKENDS = [pytest.param(FastBackend, id="fast")] + _gpu_backends()


def make(arr: np.ndarray, backend, perm: Sequence[int] | None = None, requires_grad: bool = False) -> minitorch.Tensor:
    """A tensor equal to arr whose storage is laid out in `perm` order (non-contiguous unless identity)."""
    arr = np.asarray(arr)
    if perm is None or arr.ndim < 2:
        t = minitorch.from_numpy(np.ascontiguousarray(arr), backend=backend)
    else:
        inv = np.argsort(perm)
        base = minitorch.from_numpy(np.ascontiguousarray(arr.transpose(perm)), backend=backend)
        t = base.permute(*[int(i) for i in inv])
    t.requires_grad_(requires_grad)
    return t


def np_of(t: minitorch.Tensor) -> np.ndarray:
    return np.array(t.to_numpy())


small_dims = st.integers(1, 4)
shapes = st.lists(small_dims, min_size=1, max_size=3).map(tuple)


@st.composite
def arrays(draw, shape: Tuple[int, ...] | None = None, lo: float = -3.0, hi: float = 3.0) -> np.ndarray:
    shape = draw(shapes) if shape is None else shape
    n = int(np.prod(shape))
    vals = draw(st.lists(st.floats(lo, hi, allow_nan=False, width=32), min_size=n, max_size=n))
    return np.array(vals, dtype=np.float32).reshape(shape)


@st.composite
def array_and_perm(draw, shape: Tuple[int, ...] | None = None, lo: float = -3.0, hi: float = 3.0):
    a = draw(arrays(shape, lo, hi))
    perm = draw(st.permutations(list(range(a.ndim)))) if a.ndim > 1 else None
    return a, perm


@st.composite
def broadcast_pair(draw) -> Tuple[np.ndarray, np.ndarray]:
    """Two arrays whose shapes broadcast (some dims 1 or missing on one side)."""
    out = draw(shapes)
    sa = tuple(1 if draw(st.booleans()) else s for s in out)
    sb = tuple(1 if draw(st.booleans()) else s for s in out)
    sb = sb[draw(st.integers(0, len(sb) - 1)):]
    return draw(arrays(sa)), draw(arrays(sb))
