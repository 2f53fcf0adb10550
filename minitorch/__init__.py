"""MiniTorch: tensors, autodiff and backends written from scratch. This file assembles the core with its
default backend: it hands the core's Tensor class down to the backend interface (tensor_ops) and makes
the numba CPU backend (minitorch.cpu) the default, so neither the core nor a backend imports the other's
internals. Never imports torch, transformers, cupy, models or generation; the CUDA backend
(minitorch.cuda) is imported only when asked for. Layers and seams: docs/ARCHITECTURE.md."""
from . import nn, operators
from .autodiff import is_grad_enabled, no_grad, set_grad_enabled
from .cpu import FastBackend, FastOps
from .module import Module, Parameter
from .optim import SGD, Adam, Optimizer
from .packed import PackedWeight
from .tensor import Tensor
from .tensor_data import MiniTorchError, TensorData
from .tensor_functions import Function, arange, cat, from_numpy, full, ones, rand, tensor, where, zeros
from .tensor_creation import set_default_backend
from .tensor_ops import SimpleBackend, SimpleOps, TensorBackend, TensorOps, install_tensor_class

install_tensor_class(Tensor)
set_default_backend(FastBackend)


def to_backend(t: Tensor, backend: TensorBackend) -> Tensor:
    """A copy of t on another backend."""
    return t.to_backend(backend)


__all__ = [
    "nn", "operators", "is_grad_enabled", "no_grad", "set_grad_enabled", "FastBackend", "FastOps",
    "Module", "Parameter", "PackedWeight", "SGD", "Adam", "Optimizer", "Tensor", "MiniTorchError", "TensorData",
    "Function", "arange", "cat", "from_numpy", "full", "ones", "rand", "tensor", "where", "zeros",
    "SimpleBackend", "SimpleOps", "TensorBackend", "TensorOps", "to_backend",
]
