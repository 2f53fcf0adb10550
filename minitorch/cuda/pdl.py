"""Programmatic dependent launch (PDL, sm_90+) of the decode-step kernels through the driver's
cuLaunchKernelEx, called via ctypes (CuPy's launcher sets no launch attributes).

With the PROGRAMMATIC_STREAM_SERIALIZATION attribute a kernel may start while the previous kernel
in the stream is still running; each kernel listed in PDL_KERNELS calls pdl_wait()
(kernels/includes/common.cuh) before it touches data another kernel produces or consumes, and the
GEMVs prefetch their (constant) weights into L2 before that wait, so the weight stream overlaps the
previous kernel's tail and the launch gap. Kernels outside the list launch the ordinary way.
Works inside CUDA-graph stream capture (CUDA >= 12.3 turns it into programmatic graph edges).
The same launcher starts thread-block clusters (the cluster-dimension launch attribute, sm_90):
sample_f32 and spec_accept share one row's work among a cluster's blocks (kernels/sampling.cu).
"""
from __future__ import annotations

import ctypes
from typing import Any, List, Optional, Tuple

import numpy as np

from .runtime import KernelLibrary, get_cupy

# kernels that call pdl_wait() before any dependent memory access (the GEMVs: every gemv* name)
PDL_KERNELS = frozenset({
    "embedding_bf16_f32", "add_rmsnorm_bf16", "qkv_rope_append_bf16", "qkv_rope_append_il_bf16",
    "attn_partial_bf16", "attn_partial_bf16_d64", "attn_partial_bf16_d128", "attn_combine_bf16",
    "gate_up_silu_bf16", "gate_up_silu_il_bf16", "argmax_partial_f32", "argmax_final", "decode_advance",
    "head_input_bf16", "head_feature_bf16",
    "attn_rows_partial_bf16_d64", "attn_rows_partial_bf16_d128", "attn_rows_combine_bf16", "batch_advance",
    "attn_tree_partial_bf16_d64", "attn_tree_partial_bf16_d128",
})
_ATTR_CLUSTER_DIMENSION = 4  # CUlaunchAttributeID (cuda.h)
_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6
_FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CUfunction_attribute (cuda.h)
_FUNC_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14


class _LaunchAttr(ctypes.Structure):
    """CUlaunchAttribute: a 4-byte id, padding to 8, a 64-byte value union."""
    _fields_ = [("id", ctypes.c_uint32), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int32 * 16)]


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig (cuda.h, CUDA 12/13)."""
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttr)), ("numAttrs", ctypes.c_uint)]


_SCALARS = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.int64): ctypes.c_int64,
            np.dtype(np.uint64): ctypes.c_uint64, np.dtype(np.float32): ctypes.c_float}


def _param(a: Any) -> Any:
    """One kernel argument as a ctypes value (numpy scalars by dtype, device arrays by pointer)."""
    if isinstance(a, np.generic):
        t = _SCALARS.get(a.dtype)
        if t is None:
            raise TypeError(f"PDL launch: unsupported scalar dtype {a.dtype}")
        return t(a.item())
    data = getattr(a, "data", None)
    if data is not None and hasattr(data, "ptr"):
        return ctypes.c_void_p(data.ptr)
    raise TypeError(f"PDL launch: unsupported argument {type(a).__name__}")


def _dims(d: Tuple[int, ...]) -> List[int]:
    d = tuple(int(x) for x in d)
    return list(d) + [1] * (3 - len(d))


class PdlLauncher:
    """Drop-in for KernelLibrary.launch: PDL_KERNELS and gemv* go through cuLaunchKernelEx with the
    programmatic-serialization attribute on CuPy's current stream (when pdl), a launch with
    `cluster=(x, y, z)` as thread-block clusters; everything else is delegated."""

    def __init__(self, lib: KernelLibrary, pdl: bool = True) -> None:
        self.lib = lib
        self.pdl = pdl
        self.cp = get_cupy()
        self._cuda = ctypes.CDLL("libcuda.so.1")
        self._launch_ex = self._cuda.cuLaunchKernelEx
        self._launch_ex.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p,
                                    ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        self._launch_ex.restype = ctypes.c_int
        self._set_attr = self._cuda.cuFuncSetAttribute
        self._set_attr.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        self._set_attr.restype = ctypes.c_int
        self._non_portable: set = set()
        self._smem_set: dict = {}

    def __getattr__(self, name: str) -> Any:  # get, sources, module ... of the wrapped library
        return getattr(self.lib, name)

    def launch(self, name: str, grid: Tuple[int, ...], block: Tuple[int, ...], args: Tuple[Any, ...],
               shared_mem: int = 0, cluster: Optional[Tuple[int, ...]] = None) -> None:
        """Launch `name` (with PDL when it is a PDL kernel, as clusters when `cluster` is given) on CuPy's
        current stream. Dynamic shared memory above 48 KB is opted into per kernel."""
        use_pdl = self.pdl and (name in PDL_KERNELS or name.startswith("gemv"))
        if not use_pdl and cluster is None and shared_mem <= 48 * 1024:
            self.lib.launch(name, grid, block, args, shared_mem)
            return
        fn = self.lib.get(name)
        fptr = getattr(fn, "kernel", fn).ptr  # RawKernel -> cupy.cuda.Function -> CUfunction
        if shared_mem > self._smem_set.get(name, 48 * 1024):
            rc = self._set_attr(ctypes.c_void_p(fptr), _FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(shared_mem))
            if rc != 0:
                raise RuntimeError(f"cuFuncSetAttribute({name}, {shared_mem} bytes of dynamic shared memory) failed: "
                                   f"CUresult {rc}")
            self._smem_set[name] = int(shared_mem)
        attrs = (_LaunchAttr * 2)()
        n = 0
        if use_pdl:
            attrs[n].id = _ATTR_PROGRAMMATIC_STREAM_SERIALIZATION
            attrs[n].value[0] = 1
            n += 1
        if cluster is not None:
            c = _dims(cluster)
            if c[0] * c[1] * c[2] > 8 and name not in self._non_portable:  # 9..16 blocks: opt in
                rc = self._set_attr(ctypes.c_void_p(fptr), _FUNC_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
                if rc != 0:
                    raise RuntimeError(f"cuFuncSetAttribute({name}, non-portable cluster size) failed: CUresult {rc}")
                self._non_portable.add(name)
            attrs[n].id = _ATTR_CLUSTER_DIMENSION
            attrs[n].value[0], attrs[n].value[1], attrs[n].value[2] = c
            n += 1
        g, b = _dims(grid), _dims(block)
        cfg = _LaunchConfig(g[0], g[1], g[2], b[0], b[1], b[2], int(shared_mem),
                            ctypes.c_void_p(self.cp.cuda.get_current_stream().ptr),
                            ctypes.cast(attrs, ctypes.POINTER(_LaunchAttr)), n)
        vals = [_param(a) for a in args]
        params = (ctypes.c_void_p * max(1, len(vals)))(*[ctypes.addressof(v) for v in vals])
        rc = self._launch_ex(ctypes.byref(cfg), ctypes.c_void_p(fptr), params, None)
        if rc != 0:
            raise RuntimeError(f"cuLaunchKernelEx({name}) failed with CUresult {rc}")
