"""MiniTorch: tensors, autodiff and CPU backends written from scratch (core only: never imports
torch, transformers, cupy, models or generation)."""
from . import nn, operators
from .autodiff import is_grad_enabled, no_grad, set_grad_enabled
from .cpu import FastBackend, FastOps
from .module import Module, Parameter
from .optim import SGD, Adam, Optimizer
from .packed import PackedWeight
from .tensor import Tensor
from .tensor_data import MiniTorchError, TensorData
from .tensor_functions import Function, arange, cat, from_numpy, full, ones, rand, tensor, where, zeros
from .tensor_ops import SimpleBackend, SimpleOps, TensorBackend, TensorOps


def to_backend(t: Tensor, backend: TensorBackend) -> Tensor:
    """A copy of t on another backend."""
    return t.to_backend(backend)


__all__ = [
    "nn", "operators", "is_grad_enabled", "no_grad", "set_grad_enabled", "FastBackend", "FastOps",
    "Module", "Parameter", "PackedWeight", "SGD", "Adam", "Optimizer", "Tensor", "MiniTorchError", "TensorData",
    "Function", "arange", "cat", "from_numpy", "full", "ones", "rand", "tensor", "where", "zeros",
    "SimpleBackend", "SimpleOps", "TensorBackend", "TensorOps", "to_backend",
]
