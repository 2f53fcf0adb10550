"""Shared helpers for the GPU tests: skip marker, bf16 bit conversion, upload/download."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from minitorch.cuda.runtime import cuda_available, unavailable_reason

needs_gpu = pytest.mark.skipif(not cuda_available(), reason=unavailable_reason() or "no GPU")

# Tolerances (stated once): fp32 kernels vs a float64 reference; bf16 kernels vs a float64
# reference computed from the same bf16-rounded inputs (one or two bf16 roundings of the output,
# 2^-8 relative each, plus fp32 accumulation order).
F32_TOL = dict(rtol=2e-5, atol=2e-5)
BF16_TOL = dict(rtol=2e-2, atol=2e-2)


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), round to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def from_bf16_bits(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b).astype(np.uint32) << 16).view(np.float32)


def round_bf16(x: np.ndarray) -> np.ndarray:
    return from_bf16_bits(to_bf16_bits(x))


def up(x: np.ndarray, dtype: str) -> Any:
    """Upload to a contiguous View of dtype ('float32' | 'bfloat16' | 'int64')."""
    import cupy as cp

    from minitorch.cuda.launch import view_of

    if dtype == "bfloat16":
        return view_of(cp.asarray(to_bf16_bits(x)), "bfloat16")
    return view_of(cp.asarray(np.ascontiguousarray(x, dtype=dtype)), dtype)


def down(v: Any) -> np.ndarray:
    """View -> float64 numpy array of its shape (strided read on the host)."""
    host = v.storage.get()
    if v.dtype == "bfloat16":
        host = from_bf16_bits(host)
    item = host.itemsize
    arr = np.lib.stride_tricks.as_strided(host, shape=v.shape, strides=[s * item for s in v.strides])
    return np.array(arr, dtype=np.float64)


def ref_in(x: np.ndarray, dtype: str) -> np.ndarray:
    """The values a kernel actually sees for input x stored as dtype."""
    return round_bf16(x).astype(np.float64) if dtype == "bfloat16" else x.astype(np.float64)


def tol(dtype: str) -> dict:
    return BF16_TOL if dtype == "bfloat16" else F32_TOL
