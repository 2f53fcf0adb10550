"""The CUDA backend: CudaOps (the TensorBackend slot table on the GPU) and the graph-captured decoder.

    ops.py       CudaOps / make_cuda_backend(): fills the slots of tensor_ops.TensorOps on CuPy storage
    launch.py    Python launchers of kernels/*.cu: shape checks, launch geometry, dtype dispatch
    runtime.py   lazy CuPy import, GPU detection, loading minitorch/cuda_kernels/*.fatbin (or NVRTC)
    blas.py      cuBLAS through ctypes (works inside CUDA-graph capture)
    pdl.py       programmatic dependent launch of decode-step kernels (sm_90+)
    decoder.py   CudaDecoder: whole Qwen2 decode / verify steps captured as CUDA graphs

Nothing here imports CuPy until a GPU is asked for, so `import minitorch.cuda` works without one;
`make_cuda_backend()` then raises CudaUnavailableError. The decoder takes a model's weights as arrays
(weights_from_model), not the model classes, so this package does not import minitorch.models.
"""
from .ops import CudaOps, make_cuda_backend
from .runtime import CudaUnavailableError, cuda_available, unavailable_reason

__all__ = ["CudaOps", "make_cuda_backend", "CudaUnavailableError", "cuda_available", "unavailable_reason"]
