"""The numba CPU backend: FastOps, the TensorBackend slot table that `minitorch.FastBackend` carries.

    ops.py       FastOps / FastBackend: fills the slots of tensor_ops.TensorOps, picks a kernel per call
    kernels.py   strided map / zip / where / reduce / argmax kernels (one compile per dtype signature)
    fused.py     fused kernels: softmax, log_softmax, rmsnorm, layernorm, rope, embedding, silu_mul, attention
    matmul.py    the skinny matmul: 1..16 activation rows against an (out, in) weight (decode / verify steps)
    packed.py    the packed-weight product behind the `packed_linear` slot (minitorch/packed.py's layout)

The kernel modules take numpy arrays and import nothing of the core; ops.py sees Tensors only as
arguments (it builds results through tensor_ops.new_tensor), so the core never has to be imported first.
"""
from .ops import FastBackend, FastOps

__all__ = ["FastBackend", "FastOps"]
