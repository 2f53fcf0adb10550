"""Reverse-mode autodiff: grad mode switch, Context, topological sort and backpropagation.

Under `no_grad()` Function.apply calls forward with a shared null context and records nothing,
so inference pays no autodiff cost.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, TypeVar

_state = {"grad": True}

F = TypeVar("F", bound=Callable[..., Any])


def is_grad_enabled() -> bool:
    """True when operations record history for backward."""
    return _state["grad"]


def set_grad_enabled(mode: bool) -> None:
    _state["grad"] = bool(mode)


class no_grad:
    """Context manager (and decorator): ops inside record no history."""

    __slots__ = ("_prev",)

    def __enter__(self) -> "no_grad":
        self._prev = _state["grad"]
        _state["grad"] = False
        return self

    def __exit__(self, *exc: Any) -> None:
        _state["grad"] = self._prev

    def __call__(self, fn: F) -> F:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with no_grad():
                return fn(*args, **kwargs)

        wrapper.__name__ = getattr(fn, "__name__", "wrapper")
        wrapper.__doc__ = fn.__doc__
        return wrapper  # type: ignore[return-value]


class Context:
    """Values a Function's forward saves for its backward."""

    __slots__ = ("saved_values", "extra")

    def __init__(self) -> None:
        self.saved_values: tuple = ()
        self.extra: Dict[str, Any] = {}

    def save_for_backward(self, *values: Any) -> None:
        self.saved_values = values

    def save(self, **kw: Any) -> None:
        """Save non-tensor values (dims, shapes, scalars)."""
        self.extra.update(kw)

    @property
    def saved_tensors(self) -> tuple:
        return self.saved_values


class _NullContext(Context):
    """Shared context used when no history is recorded: saving is a no-op, nothing allocated."""

    __slots__ = ()

    def save_for_backward(self, *values: Any) -> None:
        pass

    def save(self, **kw: Any) -> None:
        pass


NULL_CTX = _NullContext()


def topological_sort(variable: Any) -> List[Any]:
    """Non-constant variables reachable from `variable`, output first (iterative DFS)."""
    order: List[Any] = []
    seen = set()
    stack = [(variable, False)]
    while stack:
        v, done = stack.pop()
        if done:
            order.append(v)
            continue
        if id(v) in seen or v.is_constant():
            continue
        seen.add(id(v))
        stack.append((v, True))
        for p in v.parents:
            if id(p) not in seen and not p.is_constant():
                stack.append((p, False))
    order.reverse()
    return order


def backpropagate(variable: Any, deriv: Any) -> None:
    """Run the chain rule from `variable` (with d out/d variable = deriv), accumulating leaf grads."""
    order = topological_sort(variable)
    grads: Dict[int, Any] = {id(variable): deriv}
    for v in order:
        d = grads.pop(id(v), None)
        if d is None:
            continue
        if v.is_leaf():
            v.accumulate_derivative(d)
            continue
        for inp, g in v.chain_rule(d):
            if inp.is_constant() or g is None:
                continue
            k = id(inp)
            if k in grads:
                grads[k] = grads[k] + g
            else:
                grads[k] = g
