"""Module / Parameter / state dicts, optimizers, and real training to a stated accuracy."""
from __future__ import annotations

import numpy as np
import pytest

import minitorch
from minitorch import SGD, Adam, Module, Parameter
from backends import BACKENDS, np_of


class Block(Module):
    def __init__(self, backend) -> None:
        super().__init__()
        self.q_proj = Parameter(minitorch.zeros((2, 3), backend=backend))
        self.norm = Parameter(None)          # filled by load_state_dict


class Net(Module):
    def __init__(self, backend) -> None:
        super().__init__()
        self.embed_tokens = Parameter(minitorch.ones((4, 3), backend=backend))
        self.layer = Block(backend)
        self.other = 5                       # plain attributes are not registered


def test_named_parameters_and_load_state_dict():
    net = Net(minitorch.FastBackend)
    names = [n for n, _ in net.named_parameters()]
    assert names == ["embed_tokens", "layer.q_proj", "layer.norm"]
    assert len(net.parameters()) == 3 and net.modules()[0] is net.layer
    q = np.arange(6, dtype=np.float32).reshape(2, 3)
    net.load_state_dict({"embed_tokens": np.zeros((4, 3), np.float32), "layer.q_proj": q,
                         "layer.norm": minitorch.ones((3,))})
    np.testing.assert_array_equal(np_of(net.layer.q_proj.value), q)
    assert net.layer.norm.value.shape == (3,) and net.layer.q_proj.value.requires_grad
    with pytest.raises(minitorch.MiniTorchError, match=r"layer.q_proj.*\(3, 2\).*\(2, 3\)"):
        net.load_state_dict({"layer.q_proj": np.zeros((3, 2), np.float32)}, strict=False)
    with pytest.raises(minitorch.MiniTorchError, match="missing keys"):
        net.load_state_dict({"embed_tokens": np.zeros((4, 3), np.float32)})
    net.eval()
    assert not net.layer.training
    assert set(net.state_dict()) == set(names)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sgd_and_adam_steps(backend):
    for opt_cls, kw in ((SGD, dict(lr=0.1)), (SGD, dict(lr=0.1, momentum=0.9)), (Adam, dict(lr=0.1))):
        p = Parameter(minitorch.tensor([3.0, -2.0], backend=backend))
        opt = opt_cls([p], **kw)
        losses = []
        for _ in range(60):
            opt.zero_grad()
            loss = (p.value * p.value).sum()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[-1] < 0.05 * losses[0], (opt_cls.__name__, kw, losses[-1])
    # one SGD step is exactly p - lr * grad
    p = Parameter(minitorch.tensor([1.0, 2.0], backend=backend))
    (p.value * p.value).sum().backward()
    SGD([p], lr=0.25).step()
    np.testing.assert_allclose(np_of(p.value), [0.5, 1.0])
    with pytest.raises(minitorch.MiniTorchError, match="learning rate"):
        SGD([p], lr=0.0)


def test_mlp_training_reaches_accuracy():
    """The README's example: a 2-hidden-layer MLP trained with Adam reaches >= 95% accuracy on the
    two-moons task and the loss falls by more than 10x."""
    from project import train_example
    hist = train_example.train(epochs=60, verbose=False)
    assert hist[-1]["accuracy"] >= 0.95
    assert hist[-1]["loss"] < 0.1 * hist[0]["loss"]


def test_logistic_regression_with_sgd_simple_backend():
    """Logistic regression on a linearly separable task, SimpleOps (the reference) end to end."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 2)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.float32)
    b = minitorch.SimpleBackend
    w = Parameter(minitorch.zeros((2, 1), backend=b))
    bias = Parameter(minitorch.zeros((1,), backend=b))
    opt = SGD([w, bias], lr=1.0)
    tx, ty = minitorch.from_numpy(x, backend=b), minitorch.from_numpy(y[:, None], backend=b)
    first = None
    for _ in range(40):
        opt.zero_grad()
        p = (tx @ w.value + bias.value).sigmoid()
        loss = -(ty * p.log() + (1.0 - ty) * (1.0 - p).log()).mean()
        loss.backward()
        opt.step()
        first = first if first is not None else loss.item()
    acc = ((np_of(p) > 0.5) == (y[:, None] > 0.5)).mean()
    assert acc >= 0.95 and loss.item() < 0.5 * first
