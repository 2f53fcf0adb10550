"""Train a small MLP with MiniTorch's autodiff and Adam on a synthetic 2-class task (two interleaved
moons-like spirals), printing loss and accuracy per epoch.

    python project/train_example.py [--epochs 60] [--hidden 32] [--backend fast|simple]
"""
from __future__ import annotations

import argparse
from typing import Dict, List, Tuple

import numpy as np

import minitorch
from minitorch import Module, Parameter, nn


def make_data(n: int, seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Two noisy interleaved half-circles in 2-D; labels 0/1 (not linearly separable)."""
    rng = np.random.default_rng(seed)
    t = rng.uniform(0, np.pi, n)
    y = rng.integers(0, 2, n)
    x = np.stack([np.cos(t) + y * 1.0 - 0.5, np.sin(t) * (1 - 2 * y) + y * 0.5 - 0.25], 1)
    x += rng.normal(0, 0.1, x.shape)
    return x.astype(np.float32), y.astype(np.int64)


class Linear(Module):
    def __init__(self, n_in: int, n_out: int, backend: minitorch.TensorBackend, rng: np.random.Generator) -> None:
        super().__init__()
        w = rng.normal(0, (2.0 / n_in) ** 0.5, (n_out, n_in)).astype(np.float32)
        self.weight = Parameter(minitorch.from_numpy(w, backend=backend))
        self.bias = Parameter(minitorch.zeros((n_out,), backend=backend))

    def forward(self, x: minitorch.Tensor) -> minitorch.Tensor:
        return nn.linear(x, self.weight.value, self.bias.value)


class MLP(Module):
    def __init__(self, hidden: int, backend: minitorch.TensorBackend, seed: int = 0) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        self.layer1 = Linear(2, hidden, backend, rng)
        self.layer2 = Linear(hidden, hidden, backend, rng)
        self.out = Linear(hidden, 2, backend, rng)

    def forward(self, x: minitorch.Tensor) -> minitorch.Tensor:
        return self.out(self.layer2(self.layer1(x).relu()).relu())     # (N, 2) logits


def train(epochs: int = 60, hidden: int = 32, lr: float = 0.02, n: int = 256,
          backend: minitorch.TensorBackend = minitorch.FastBackend, seed: int = 0,
          verbose: bool = True) -> List[Dict[str, float]]:
    """Full-batch training; returns per-epoch {'loss', 'accuracy'}."""
    x_np, y_np = make_data(n, seed)
    x = minitorch.from_numpy(x_np, backend=backend)
    onehot = minitorch.from_numpy(np.eye(2, dtype=np.float32)[y_np], backend=backend)
    model = MLP(hidden, backend, seed)
    opt = minitorch.Adam(model.parameters(), lr=lr)
    history = []
    for epoch in range(epochs):
        opt.zero_grad()
        logits = model(x)
        loss = -(nn.log_softmax(logits, -1) * onehot).sum() * (1.0 / n)
        loss.backward()
        opt.step()
        acc = float((logits.argmax(-1).to_numpy() == y_np).mean())
        history.append({"loss": loss.item(), "accuracy": acc})
        if verbose and (epoch % 10 == 0 or epoch == epochs - 1):
            print(f"epoch {epoch:3d}  loss {loss.item():.4f}  accuracy {acc:.3f}")
    return history


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=60, help="full-batch epochs")
    ap.add_argument("--hidden", type=int, default=32, help="hidden units per layer")
    ap.add_argument("--lr", type=float, default=0.02, help="Adam learning rate")
    ap.add_argument("--backend", choices=["fast", "simple"], default="fast", help="tensor backend")
    args = ap.parse_args()
    backend = minitorch.FastBackend if args.backend == "fast" else minitorch.SimpleBackend
    hist = train(args.epochs, args.hidden, args.lr, backend=backend)
    print(f"final loss {hist[-1]['loss']:.4f}, accuracy {hist[-1]['accuracy']:.3f}")


if __name__ == "__main__":
    main()
