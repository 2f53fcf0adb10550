"""Tensor: the user-facing n-d array with autodiff (torch-like API, minitorch structure).

A Tensor is a TensorData (storage + shape + strides) plus the backend slot table that runs its ops
and, when it was made under grad mode from inputs that require grad, the History that made it.
"""
from __future__ import annotations

from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import tensor_functions as tf
from .autodiff import backpropagate, no_grad
from .tensor_data import MiniTorchError, Spec, TensorData, norm_dim, prod

class Tensor:
    """An n-d float32 / int64 array on a backend, with optional gradient tracking."""

    __slots__ = ("_tensor", "backend", "history", "requires_grad", "grad", "__weakref__")

    def __init__(self, td: TensorData, backend: Any, history: Optional[tf.History] = None,
                 requires_grad: bool = False) -> None:
        self._tensor = td
        self.backend = backend
        self.history = history
        self.requires_grad = requires_grad
        self.grad: Optional[Tensor] = None

    # ---- construction helpers ----
    def _new(self, td: TensorData) -> "Tensor":
        t = Tensor.__new__(Tensor)
        t._tensor = td
        t.backend = self.backend
        t.history = None
        t.requires_grad = False
        t.grad = None
        return t

    def _shallow(self) -> "Tensor":
        return self._new(self._tensor)

    def _lift(self, v: Any) -> "Tensor":
        """A Python number as a 0-d tensor on this backend (int stays int64 next to int64)."""
        if isinstance(v, Tensor):
            return v
        if isinstance(v, (bool, int, np.integer)) and self._tensor.dtype == "int64":
            arr, dt = np.array([v], dtype=np.int64), "int64"
        elif isinstance(v, (int, float, np.integer, np.floating, bool)):
            arr, dt = np.array([v], dtype=np.float32), "float32"
        else:
            raise MiniTorchError(f"cannot combine a tensor with {type(v).__name__}")
        return self._new(TensorData.make(self.backend.asarray(arr), (), (), dt, True))

    # ---- properties ----
    @property
    def shape(self) -> Tuple[int, ...]:
        return self._tensor.shape

    @property
    def size(self) -> int:
        return self._tensor.size

    @property
    def dims(self) -> int:
        return self._tensor.dims

    @property
    def dtype(self) -> str:
        return self._tensor.dtype

    @property
    def strides(self) -> Tuple[int, ...]:
        return self._tensor.strides

    def is_contiguous(self) -> bool:
        return self._tensor.is_contiguous()

    def to_numpy(self) -> np.ndarray:
        """A numpy VIEW of the storage with this tensor's shape/strides on CPU (a copy from GPU)."""
        return self.backend.to_numpy(self._tensor)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.to_numpy()
        return a.astype(dtype) if dtype is not None else a

    def tolist(self) -> Any:
        return self.to_numpy().tolist()

    def item(self) -> Union[float, int]:
        if self.size != 1:
            raise MiniTorchError(f"item() needs a tensor with one element, got shape {self.shape}")
        return self.to_numpy().reshape(-1)[0].item()

    def __len__(self) -> int:
        if not self.shape:
            raise MiniTorchError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self) -> Iterator["Tensor"]:
        for i in range(len(self)):
            yield self[i]

    def __bool__(self) -> bool:
        if self.size != 1:
            raise MiniTorchError(f"truth value of a tensor with shape {self.shape} is ambiguous")
        return bool(self.item())

    def __repr__(self) -> str:
        g = ", requires_grad=True" if self.requires_grad else ""
        return f"Tensor({np.array2string(np.asarray(self.to_numpy()), precision=4)}, dtype={self.dtype}{g})"

    __hash__ = object.__hash__

    # ---- autodiff plumbing ----
    def is_leaf(self) -> bool:
        return self.history is None

    def is_constant(self) -> bool:
        return self.history is None and not self.requires_grad

    @property
    def parents(self) -> List["Tensor"]:
        return [v for v in self.history.inputs if isinstance(v, Tensor)] if self.history else []

    def chain_rule(self, d: "Tensor") -> List[Tuple["Tensor", "Tensor"]]:
        h = self.history
        grads = h.last_fn.backward(h.ctx, d)
        out = []
        for inp, g in zip(h.inputs, grads):
            if isinstance(inp, Tensor) and g is not None:
                out.append((inp, _unbroadcast(g, inp.shape)))
        return out

    def accumulate_derivative(self, d: "Tensor") -> None:
        if not d._tensor.is_contiguous() or d.dtype != "float32":
            d = d.backend.cast(d, "float32") if d.dtype != "float32" else d.backend.id_map(d)
        self.grad = d if self.grad is None else self.grad + d

    def requires_grad_(self, flag: bool = True) -> "Tensor":
        self.requires_grad = flag
        return self

    def detach(self) -> "Tensor":
        return self._shallow()

    def backward(self, grad: Optional["Tensor"] = None) -> None:
        """Backpropagate; grad defaults to 1 for a one-element tensor."""
        if grad is None:
            if self.size != 1:
                raise MiniTorchError(f"backward() without grad needs a one-element tensor, got shape {self.shape}")
            grad = tf.ones(self.shape, backend=self.backend)
        if not self.requires_grad:
            raise MiniTorchError("backward() on a tensor that does not require grad")
        with no_grad():
            backpropagate(self, grad)

    def zero_grad_(self) -> None:
        self.grad = None

    # ---- arithmetic ----
    def __add__(self, b: Any) -> "Tensor":
        return tf.Add.apply(self, b if isinstance(b, Tensor) else self._lift(b))

    def __radd__(self, b: Any) -> "Tensor":
        return tf.Add.apply(self._lift(b), self)

    def __sub__(self, b: Any) -> "Tensor":
        return tf.Sub.apply(self, b if isinstance(b, Tensor) else self._lift(b))

    def __rsub__(self, b: Any) -> "Tensor":
        return tf.Sub.apply(self._lift(b), self)

    def __mul__(self, b: Any) -> "Tensor":
        return tf.Mul.apply(self, b if isinstance(b, Tensor) else self._lift(b))

    def __rmul__(self, b: Any) -> "Tensor":
        return tf.Mul.apply(self._lift(b), self)

    def __truediv__(self, b: Any) -> "Tensor":
        return tf.Div.apply(self, b if isinstance(b, Tensor) else self._lift(b))

    def __rtruediv__(self, b: Any) -> "Tensor":
        return tf.Div.apply(self._lift(b), self)

    def __pow__(self, b: Any) -> "Tensor":
        return tf.Pow.apply(self, b if isinstance(b, Tensor) else self._lift(float(b)))

    def __neg__(self) -> "Tensor":
        return tf.Neg.apply(self)

    def __lt__(self, b: Any) -> "Tensor":
        return tf.Lt.apply(self, b if isinstance(b, Tensor) else self._lift(b))

    def __gt__(self, b: Any) -> "Tensor":
        return tf.Gt.apply(self, b if isinstance(b, Tensor) else self._lift(b))

    def __eq__(self, b: Any) -> "Tensor":  # type: ignore[override]
        return tf.Eq.apply(self, b if isinstance(b, Tensor) else self._lift(b))

    def __ne__(self, b: Any) -> "Tensor":  # type: ignore[override]
        return 1.0 - (self == b)

    def __le__(self, b: Any) -> "Tensor":
        return 1.0 - (self > b)

    def __ge__(self, b: Any) -> "Tensor":
        return 1.0 - (self < b)

    def __matmul__(self, b: "Tensor") -> "Tensor":
        return tf.MatMul.apply(self, b)

    def exp(self) -> "Tensor":
        return tf.Exp.apply(self)

    def log(self) -> "Tensor":
        return tf.Log.apply(self)

    def sqrt(self) -> "Tensor":
        return tf.Sqrt.apply(self)

    def rsqrt(self) -> "Tensor":
        return tf.Rsqrt.apply(self)

    def sigmoid(self) -> "Tensor":
        return tf.Sigmoid.apply(self)

    def relu(self) -> "Tensor":
        return tf.Relu.apply(self)

    def silu(self) -> "Tensor":
        return tf.Silu.apply(self)

    def tanh(self) -> "Tensor":
        return tf.Tanh.apply(self)

    def masked_fill(self, mask: "Tensor", value: float) -> "Tensor":
        """Where mask != 0 take value, else self (mask broadcasts)."""
        return tf.Where.apply(mask, self._lift(value), self)

    # ---- reductions ----
    def sum(self, dim: Optional[int] = None, keepdim: bool = False) -> "Tensor":
        return self._reduce(tf.Sum, dim, keepdim)

    def mean(self, dim: Optional[int] = None, keepdim: bool = False) -> "Tensor":
        n = self.size if dim is None else self.shape[norm_dim(dim, self.dims, self.shape)]
        return self.sum(dim, keepdim) * (1.0 / max(n, 1))

    def max(self, dim: Optional[int] = None, keepdim: bool = False) -> "Tensor":
        return self._reduce(tf.Max, dim, keepdim)

    def _reduce(self, fn: type, dim: Optional[int], keepdim: bool) -> "Tensor":
        if dim is None:
            if self.dims == 0:
                return fn.apply(self.view(1), 0).view(())
            out = fn.apply(self.reshape(self.size), 0)
            return out.view(*([1] * self.dims)) if keepdim else out.view(())
        d = norm_dim(dim, self.dims, self.shape)
        out = fn.apply(self, d)
        return out if keepdim else out.squeeze(d)

    def argmax(self, dim: int = -1, keepdim: bool = False) -> "Tensor":
        """Index of the (first) max along dim, int64, no gradient."""
        d = norm_dim(dim, self.dims, self.shape)
        out = self.backend.argmax(self, d)
        return out if keepdim else out.squeeze(d)

    # ---- views ----
    def permute(self, *order: int) -> "Tensor":
        if len(order) == 1 and isinstance(order[0], (tuple, list)):
            order = tuple(order[0])
        order = tuple(norm_dim(o, self.dims, self.shape) for o in order)
        return tf.Permute.apply(self, order)

    def transpose(self, d0: int, d1: int) -> "Tensor":
        n = self.dims
        d0, d1 = norm_dim(d0, n, self.shape), norm_dim(d1, n, self.shape)
        order = list(range(n))
        order[d0], order[d1] = d1, d0
        return tf.Permute.apply(self, tuple(order))

    def _infer_shape(self, shape: Sequence[Any]) -> Tuple[int, ...]:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = tuple(int(s) for s in shape)
        if -1 in shape:
            known = prod(s for s in shape if s != -1)
            if shape.count(-1) > 1 or known == 0 or self.size % known:
                raise MiniTorchError(f"cannot view shape {self.shape} as {shape}")
            shape = tuple(self.size // known if s == -1 else s for s in shape)
        if prod(shape) != self.size:
            raise MiniTorchError(f"cannot view shape {self.shape} ({self.size} elements) as {shape}")
        return shape

    def view(self, *shape: Any) -> "Tensor":
        """Same storage, new shape; the tensor must be contiguous."""
        return tf.View.apply(self, self._infer_shape(shape))

    def reshape(self, *shape: Any) -> "Tensor":
        """A view when contiguous, else a contiguous copy."""
        shape = self._infer_shape(shape)
        t = self if self._tensor.is_contiguous() else tf.Contiguous.apply(self)
        return tf.View.apply(t, shape)

    def contiguous(self) -> "Tensor":
        return tf.Contiguous.apply(self)

    def expand(self, *shape: Any) -> "Tensor":
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        k = len(shape) - self.dims
        if k < 0:
            raise MiniTorchError(f"cannot expand shape {self.shape} to {tuple(shape)}")
        shape = tuple(self.shape[i - k] if s == -1 and i >= k else int(s) for i, s in enumerate(shape))
        if any(s < 0 for s in shape):
            raise MiniTorchError(f"cannot expand shape {self.shape} to {shape}")
        if shape == self.shape:
            return self
        return tf.Expand.apply(self, shape)

    def _slice(self, spec: Spec) -> "Tensor":
        return tf.Slice.apply(self, spec)

    def narrow(self, dim: int, start: int, length: int) -> "Tensor":
        d = norm_dim(dim, self.dims, self.shape)
        n = self.shape[d]
        if start < 0:
            start += n
        if not (0 <= start and length >= 0 and start + length <= n):
            raise MiniTorchError(f"narrow(dim={dim}, start={start}, length={length}) out of range "
                                 f"for shape {self.shape}")
        spec = tuple(("s", 0, 1, self.shape[i]) for i in range(d)) + (("s", start, 1, length),)
        return tf.Slice.apply(self, spec)

    def unsqueeze(self, dim: int) -> "Tensor":
        d = norm_dim(dim, self.dims + 1, self.shape)
        spec = tuple(("s", 0, 1, self.shape[i]) for i in range(d)) + (("n",),)
        return tf.Slice.apply(self, spec)

    def squeeze(self, dim: int) -> "Tensor":
        d = norm_dim(dim, self.dims, self.shape)
        if self.shape[d] != 1:
            raise MiniTorchError(f"squeeze(dim={dim}) needs size 1, shape is {self.shape}")
        spec = tuple(("s", 0, 1, self.shape[i]) for i in range(d)) + (("i", 0),)
        return tf.Slice.apply(self, spec)

    def __getitem__(self, key: Any) -> "Tensor":
        return tf.Slice.apply(self, self._parse_key(key))

    def __setitem__(self, key: Any, value: Any) -> None:
        self[key].copy_(value)

    def _parse_key(self, key: Any) -> Spec:
        if not isinstance(key, tuple):
            key = (key,)
        n_used = sum(1 for k in key if k is not None and k is not Ellipsis)
        if n_used > self.dims:
            raise MiniTorchError(f"too many indices ({n_used}) for tensor of shape {self.shape}")
        spec: List[tuple] = []
        d = 0
        for k in key:
            if k is Ellipsis:
                for _ in range(self.dims - n_used):
                    spec.append(("s", 0, 1, self.shape[d]))
                    d += 1
            elif k is None:
                spec.append(("n",))
            elif isinstance(k, (int, np.integer)):
                n = self.shape[d]
                i = int(k) + n if k < 0 else int(k)
                if not 0 <= i < n:
                    raise MiniTorchError(f"index {k} out of range for dim {d} of shape {self.shape}")
                spec.append(("i", i))
                d += 1
            elif isinstance(k, slice):
                start, stop, step = k.indices(self.shape[d])
                if step <= 0:
                    raise MiniTorchError(f"slice step must be positive, got {k.step}")
                spec.append(("s", start, step, len(range(start, stop, step))))
                d += 1
            else:
                raise MiniTorchError(f"unsupported index {type(k).__name__}; use ints and slices")
        return tuple(spec)

    # ---- dtype / backend / in place ----
    def to(self, dtype: str) -> "Tensor":
        if dtype == self.dtype:
            return self
        return tf.Cast.apply(self, dtype)

    def float(self) -> "Tensor":
        return self.to("float32")

    def long(self) -> "Tensor":
        return self.to("int64")

    def to_backend(self, backend: Any) -> "Tensor":
        """A copy on another backend (no history)."""
        return tf.from_numpy(np.array(self.to_numpy()), backend=backend, dtype=self.dtype)

    def copy_(self, src: Any) -> "Tensor":
        """In place: write src (broadcast to self.shape) into self, which may be a strided view."""
        if not isinstance(src, Tensor):
            src = self._lift(src)
        elif src.backend is not self.backend:
            src = src.to_backend(self.backend)
        self.backend.copy_(self, src)
        return self

    def fill_(self, value: float) -> "Tensor":
        return self.copy_(value)


def _unbroadcast(g: Tensor, shape: Tuple[int, ...]) -> Tensor:
    """Sum a gradient of a broadcast result back to an input's shape."""
    if g.shape == shape:
        return g
    k = g.dims - len(shape)
    if k < 0:
        return g.reshape(*shape)
    for _ in range(k):
        g = g.sum(0)
    for i, s in enumerate(shape):
        if s == 1 and g.shape[i] != 1:
            g = g.sum(i, keepdim=True)
    return g
