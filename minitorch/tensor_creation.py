"""Tensor creation: from numpy (sharing memory where possible), from Python data, and filled tensors.
`backend=None` means the default backend (FastBackend, installed by minitorch/__init__.py: the core
never imports a backend package)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Tuple

import numpy as np

from .tensor_data import DTYPES, MiniTorchError, TensorData, prod
from .tensor_ops import from_array, make_tensor

if TYPE_CHECKING:
    from .tensor import Tensor
    from .tensor_ops import TensorBackend

_default: Optional["TensorBackend"] = None


def set_default_backend(backend: "TensorBackend") -> None:
    """The backend that creation functions use when given none (minitorch/__init__.py sets FastBackend)."""
    global _default
    _default = backend


def _default_backend() -> "TensorBackend":
    if _default is None:
        raise MiniTorchError("no default backend: import minitorch (its __init__ sets FastBackend)")
    return _default


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise MiniTorchError(f"dtype {dtype!r} not supported on CPU; use one of {sorted(DTYPES)}")


def from_numpy(arr: np.ndarray, backend: Optional["TensorBackend"] = None, dtype: Optional[str] = None) -> "Tensor":
    """Wrap a numpy array. float32/int64 CPU arrays with non-negative strides share memory (no copy);
    other dtypes are converted (float -> float32, int/bool -> int64 unless dtype says otherwise)."""
    return from_array(arr, backend or _default_backend(), dtype)


def tensor(data: Any, backend: Optional["TensorBackend"] = None, dtype: str = "float32",
           requires_grad: bool = False) -> "Tensor":
    """A new tensor from nested lists / numbers / arrays (always a copy)."""
    _check_dtype(dtype)
    arr = np.array(data, dtype=DTYPES[dtype])
    t = from_numpy(arr, backend=backend, dtype=dtype)
    t.requires_grad = requires_grad
    return t


def _shape_arg(shape: Any) -> Tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise MiniTorchError(f"negative dimension in shape {shape}")
    return shape


def full(shape: Any, value: float, backend: Optional["TensorBackend"] = None, dtype: str = "float32") -> "Tensor":
    """A new tensor filled with value."""
    backend = backend or _default_backend()
    shape = _shape_arg(shape)
    if dtype == "bfloat16":  # fill() would write float bits into bf16 storage
        return full(shape, value, backend=backend, dtype="float32").to("bfloat16")
    storage = backend.empty(prod(shape), dtype)
    storage.fill(value)
    return make_tensor(TensorData(storage, shape, None, dtype), backend)


def zeros(shape: Any, backend: Optional["TensorBackend"] = None, dtype: str = "float32") -> "Tensor":
    return full(shape, 0, backend=backend, dtype=dtype)


def ones(shape: Any, backend: Optional["TensorBackend"] = None, dtype: str = "float32") -> "Tensor":
    return full(shape, 1, backend=backend, dtype=dtype)


def arange(n: int, backend: Optional["TensorBackend"] = None, dtype: str = "int64") -> "Tensor":
    _check_dtype(dtype)
    return from_numpy(np.arange(n, dtype=DTYPES[dtype]), backend=backend, dtype=dtype)


def rand(shape: Any, backend: Optional["TensorBackend"] = None, seed: Optional[int] = None,
         requires_grad: bool = False) -> "Tensor":
    """Uniform [0, 1) float32 values (numpy generator, seedable)."""
    arr = np.random.default_rng(seed).random(_shape_arg(shape), dtype=np.float32)
    t = from_numpy(arr, backend=backend)
    t.requires_grad = requires_grad
    return t
