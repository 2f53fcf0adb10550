"""cuBLAS through ctypes: bf16/fp32 GEMMs that also work inside CUDA-graph stream capture.

CuPy's own cuBLAS wrapper refuses to run under stream capture; calling libcublas directly works
(DESIGN.md, measured on the H200): create a handle, set its stream and a fixed workspace before
capture, then call cublasGemmEx / cublasGemmStridedBatchedEx inside it.

Row-major helpers: cuBLAS is column-major, so a row-major C[M,N] = A[M,K] @ B is computed as the
column-major C^T = B^T @ A^T with the operands swapped.
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
from typing import Any, Optional

from .runtime import get_cupy

CUDA_R_32F = 0
CUDA_R_16BF = 14
CUBLAS_COMPUTE_32F = 68
CUBLAS_COMPUTE_32F_FAST_TF32 = 77  # float32 GEMMs on the tensor cores (TF32 inputs: 10-bit mantissas), fp32 accumulation
CUBLAS_GEMM_DEFAULT = -1
OP_N, OP_T = 0, 1
DTYPE_CODES = {"float32": CUDA_R_32F, "bfloat16": CUDA_R_16BF}


def _find_cublas() -> ctypes.CDLL:
    """Load libcublas: the copy CuPy already loaded, else cuda-pathfinder, else common folders."""
    cp = get_cupy()
    try:  # make CuPy load its cuBLAS, so dlopen by soname finds the same library
        import cupy_backends.cuda.libs.cublas  # noqa: F401, PLC0415
    except Exception:
        pass
    errors = []
    for name in ("libcublas.so.13", "libcublas.so.12", "libcublas.so"):
        try:
            return ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            errors.append(str(e))
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib  # noqa: PLC0415

        lib = load_nvidia_dynamic_lib("cublas")
        return ctypes.CDLL(lib.abs_path, mode=ctypes.RTLD_GLOBAL)
    except Exception as e:
        errors.append(str(e))
    roots = [os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"] + sys.path
    for root in roots:
        if not root:
            continue
        for pat in ("lib64/libcublas.so*", "nvidia/*/lib/libcublas.so*", "nvidia/cublas/lib/libcublas.so*"):
            for path in sorted(glob.glob(os.path.join(root, pat))):
                if "Lt" in os.path.basename(path):
                    continue
                try:
                    return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                except OSError as e:
                    errors.append(str(e))
    del cp
    raise RuntimeError("cannot load libcublas (tried CuPy's copy, cuda-pathfinder, CUDA_PATH, site-packages): "
                       + "; ".join(errors[-3:]))


class Cublas:
    """One cuBLAS handle bound to a stream, with a fixed workspace (so graph capture can use it)."""

    def __init__(self, workspace_bytes: int = 32 << 20) -> None:
        cp = get_cupy()
        self.lib = _find_cublas()
        self.handle = ctypes.c_void_p()
        self._check(self.lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate_v2")
        self.workspace = cp.empty(workspace_bytes, dtype=cp.uint8)
        self._check(self.lib.cublasSetWorkspace_v2(self.handle, ctypes.c_void_p(self.workspace.data.ptr),
                                                   ctypes.c_size_t(workspace_bytes)), "cublasSetWorkspace_v2")
        self._alpha = ctypes.c_float(1.0)
        self._beta = ctypes.c_float(0.0)
        self._beta_other = ctypes.c_float(0.0)  # alpha/beta live as long as the handle (graph replays)
        self._stream: Optional[int] = None
        self.fp32_compute = CUBLAS_COMPUTE_32F  # set_tf32(True): float32 GEMMs in TF32 (training, not decoding)
        gemm = self.lib.cublasGemmEx
        gemm.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                         ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                         ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                         ctypes.c_int, ctypes.c_int, ctypes.c_int]
        sb = self.lib.cublasGemmStridedBatchedEx
        sb.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_longlong,
                       ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p,
                       ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_int,
                       ctypes.c_int, ctypes.c_int]

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"cuBLAS {what} failed with status {status}")

    def sync_stream(self) -> None:
        """Bind the handle to CuPy's current stream (call before launching, and before capture)."""
        cp = get_cupy()
        ptr = cp.cuda.get_current_stream().ptr
        if ptr != self._stream:
            self._check(self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(ptr)), "cublasSetStream_v2")
            self._stream = ptr

    def _compute(self, atype: int) -> int:
        """cuBLAS compute type: fp32 accumulation always; TF32 tensor-core inputs only for float32 operands
        after set_tf32(True)."""
        return self.fp32_compute if atype == CUDA_R_32F else CUBLAS_COMPUTE_32F

    def gemm(self, ta: int, tb: int, m: int, n: int, k: int, a: int, atype: int, lda: int, b: int, btype: int,
             ldb: int, c: int, ctype: int, ldc: int, beta: float = 0.0) -> None:
        """Column-major C(m,n) = op(A) op(B) (+ beta C) with fp32 accumulation; pointers as ints."""
        self.sync_stream()
        if beta != self._beta.value:
            self._beta_other.value = beta
        bptr = ctypes.addressof(self._beta if beta == self._beta.value else self._beta_other)
        self._check(self.lib.cublasGemmEx(self.handle, ta, tb, m, n, k, ctypes.addressof(self._alpha), a, atype, lda,
                                          b, btype, ldb, bptr, c, ctype, ldc, self._compute(atype),
                                          CUBLAS_GEMM_DEFAULT), "cublasGemmEx")

    def gemm_batched(self, ta: int, tb: int, m: int, n: int, k: int, a: int, atype: int, lda: int, sa: int,
                     b: int, btype: int, ldb: int, sb: int, c: int, ctype: int, ldc: int, sc: int,
                     batch: int) -> None:
        """Strided-batched column-major GEMM (stride 0 broadcasts an operand over the batch)."""
        self.sync_stream()
        self._check(self.lib.cublasGemmStridedBatchedEx(
            self.handle, ta, tb, m, n, k, ctypes.addressof(self._alpha), a, atype, lda, sa, b, btype, ldb, sb,
            ctypes.addressof(self._beta), c, ctype, ldc, sc, batch, self._compute(atype), CUBLAS_GEMM_DEFAULT),
            "cublasGemmStridedBatchedEx")

    def linear(self, x: int, w: int, y: int, M: int, N: int, K: int, xtype: int, wtype: int, ytype: int) -> None:
        """Row-major y[M,N] = x[M,K] @ w[N,K]^T (checkpoint weight layout), all contiguous."""
        self.gemm(OP_T, OP_N, N, M, K, w, wtype, K, x, xtype, K, y, ytype, N)


_blas: Optional[Cublas] = None


def cublas() -> Cublas:
    """The process-wide cuBLAS handle."""
    global _blas
    if _blas is None:
        _blas = Cublas()
    return _blas


def set_tf32(on: bool) -> bool:
    """float32 GEMMs through TF32 tensor cores (True) or exact fp32 (False, the default); returns the old setting.
    Only project/train_draft_head.py turns it on (the head's steps, the target's features); no decoding program
    does, and bf16 products keep fp32 compute either way."""
    blas = cublas()
    old = blas.fp32_compute == CUBLAS_COMPUTE_32F_FAST_TF32
    blas.fp32_compute = CUBLAS_COMPUTE_32F_FAST_TF32 if on else CUBLAS_COMPUTE_32F
    return old


def data_ptr(arr: Any) -> int:
    """Device address of a CuPy array's first element."""
    return int(arr.data.ptr)
