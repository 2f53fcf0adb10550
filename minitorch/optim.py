"""Optimizers: SGD (with momentum) and Adam, updating Parameters in place with tensor ops."""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from .autodiff import no_grad
from .module import Parameter
from .tensor import Tensor
from .tensor_data import MiniTorchError


class Optimizer:
    def __init__(self, parameters: Sequence[Parameter], lr: float) -> None:
        self.parameters: List[Parameter] = list(parameters)
        if lr <= 0:
            raise MiniTorchError(f"learning rate must be > 0, got {lr}")
        self.lr = lr

    def zero_grad(self) -> None:
        for p in self.parameters:
            if p.value is not None:
                p.value.grad = None

    def _live(self) -> List[Tuple[int, Tensor, Tensor]]:
        """(key, value, grad) for parameters that have a gradient."""
        return [(id(p), p.value, p.value.grad) for p in self.parameters
                if p.value is not None and p.value.grad is not None]

    def step(self) -> None:
        raise NotImplementedError


class SGD(Optimizer):
    """p -= lr * (g + wd * p), with optional momentum buffer."""

    def __init__(self, parameters: Sequence[Parameter], lr: float = 0.01, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> None:
        super().__init__(parameters, lr)
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.buf: Dict[int, Tensor] = {}

    def step(self) -> None:
        with no_grad():
            for k, p, g in self._live():
                if self.weight_decay:
                    g = g + p * self.weight_decay
                if self.momentum:
                    b = self.buf.get(k)
                    b = g if b is None else b * self.momentum + g
                    self.buf[k] = b
                    g = b
                p.copy_(p - g * self.lr)


class Adam(Optimizer):
    """Adam (Kingma & Ba 2015) with bias correction; weight_decay is L2 added to the gradient."""

    def __init__(self, parameters: Sequence[Parameter], lr: float = 1e-3, betas: tuple = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0) -> None:
        super().__init__(parameters, lr)
        self.b1, self.b2 = betas
        self.eps = eps
        self.weight_decay = weight_decay
        self.t = 0
        self.m: Dict[int, Tensor] = {}
        self.v: Dict[int, Tensor] = {}

    def step(self) -> None:
        self.t += 1
        c1 = 1.0 - self.b1 ** self.t
        c2 = 1.0 - self.b2 ** self.t
        with no_grad():
            for k, p, g in self._live():
                if self.weight_decay:
                    g = g + p * self.weight_decay
                m = self.m.get(k)
                v = self.v.get(k)
                m = g * (1 - self.b1) if m is None else m * self.b1 + g * (1 - self.b1)
                v = g * g * (1 - self.b2) if v is None else v * self.b2 + g * g * (1 - self.b2)
                self.m[k], self.v[k] = m, v
                p.copy_(p - (m * (self.lr / c1)) / ((v * (1.0 / c2)).sqrt() + self.eps))
