"""Module / Parameter: a tree of named submodules and parameters, with state-dict loading by name."""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import numpy as np

from .tensor import Tensor
from .tensor_data import MiniTorchError
from .tensor_functions import from_numpy


class Parameter:
    """A named slot holding a Tensor (`.value`) that a Module owns and an optimizer updates
    (minitorch's convention). The value may be None until weights are loaded."""

    def __init__(self, x: Optional[Tensor] = None, name: Optional[str] = None, requires_grad: bool = True) -> None:
        self.value = x
        self.name = name
        self.requires_grad = requires_grad
        if x is not None:
            x.requires_grad_(requires_grad)

    def update(self, x: Tensor) -> None:
        """Replace the value (the Parameter object keeps its identity for modules and optimizers)."""
        self.value = x
        if x is not None:
            x.requires_grad_(self.requires_grad)

    def __repr__(self) -> str:
        return f"Parameter({self.value!r})"


class Module:
    """Base class: attributes that are Modules or Parameters are registered by name."""

    def __init__(self) -> None:
        self.__dict__["_modules"] = {}
        self.__dict__["_parameters"] = {}
        self.__dict__["training"] = True

    def __setattr__(self, key: str, val: Any) -> None:
        if "_modules" not in self.__dict__:
            raise MiniTorchError(f"{type(self).__name__}.__init__ must call super().__init__() before setting {key}")
        self._modules.pop(key, None)
        self._parameters.pop(key, None)
        if isinstance(val, Parameter):
            self._parameters[key] = val
        elif isinstance(val, Module):
            self._modules[key] = val
        self.__dict__[key] = val

    def modules(self) -> List["Module"]:
        return list(self._modules.values())

    def named_parameters(self, prefix: str = "") -> List[Tuple[str, Parameter]]:
        """(dotted name, Parameter) for this module and all descendants."""
        out = [(prefix + k, p) for k, p in self._parameters.items()]
        for name, m in self._modules.items():
            out.extend(m.named_parameters(prefix + name + "."))
        return out

    def parameters(self) -> List[Parameter]:
        return [p for _, p in self.named_parameters()]

    def add_parameter(self, name: str, value: Optional[Tensor]) -> Parameter:
        p = value if isinstance(value, Parameter) else Parameter(value, name)
        setattr(self, name, p)
        return p

    def train(self) -> None:
        for m in self._walk():
            m.__dict__["training"] = True

    def eval(self) -> None:
        for m in self._walk():
            m.__dict__["training"] = False

    def _walk(self) -> Iterator["Module"]:
        yield self
        for m in self._modules.values():
            yield from m._walk()

    def zero_grad(self) -> None:
        for p in self.parameters():
            if p.value is not None:
                p.value.grad = None

    def state_dict(self) -> Dict[str, Optional[Tensor]]:
        return {k: p.value for k, p in self.named_parameters()}

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> None:
        """Set parameters by dotted name from Tensors or numpy arrays (shapes must match)."""
        params = dict(self.named_parameters())
        if strict:
            missing = sorted(set(params) - set(state))
            extra = sorted(set(state) - set(params))
            if missing or extra:
                raise MiniTorchError(f"load_state_dict: missing keys {missing[:5]}, unexpected keys {extra[:5]}"
                                     + (" ..." if len(missing) > 5 or len(extra) > 5 else ""))
        for name, val in state.items():
            if name not in params:
                continue
            p = params[name]
            old = p.value
            shape = tuple(val.shape)
            if old is not None and shape != old.shape:
                raise MiniTorchError(f"load_state_dict: {name} has shape {shape}, parameter expects {old.shape}")
            backend = old.backend if old is not None else (val.backend if isinstance(val, Tensor) else None)
            if isinstance(val, Tensor):
                t = val if val.backend is backend else val.to_backend(backend)
            else:
                t = from_numpy(np.asarray(val), backend=backend)
            p.update(t.to(old.dtype) if old is not None else t)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def __repr__(self) -> str:
        inner = "".join(f"\n  ({k}): " + repr(m).replace("\n", "\n  ") for k, m in self._modules.items())
        return f"{type(self).__name__}({inner}\n)" if inner else f"{type(self).__name__}()"
