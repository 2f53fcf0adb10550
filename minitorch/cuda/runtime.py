"""CUDA runtime glue: lazy CuPy import, GPU detection, and loading our kernels.

Kernels come from `minitorch/cuda_kernels/<file>.fatbin`, built by `compile_cuda.sh` (nvcc, sm_80 +
sm_90 + PTX). When a build is missing, the same `kernels/<file>.cu` source is compiled at run time
through NVRTC (CuPy's RawModule), with a one-line notice on stderr. Nothing here imports CuPy until
a GPU is actually asked for, so `import minitorch` works on machines without one.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

PKG_DIR = Path(__file__).resolve().parents[1]  # minitorch/ (the build goes to minitorch/cuda_kernels/)
# compile_cuda.sh honours the same variable (a second build, e.g. with other NVCC_FLAGS, for A/B timing)
BUILD_DIR = Path(os.environ.get("MINITORCH_CUDA_BUILD_DIR") or PKG_DIR / "cuda_kernels")
SRC_DIR = PKG_DIR.parent / "kernels"

# kernel-name prefix -> kernels/<file>.cu (longest prefix wins)
KERNEL_FILES: Dict[str, str] = {
    "map_": "elementwise", "zip_": "elementwise", "cast_": "elementwise", "fill_": "elementwise", "where_": "elementwise",
    "reduce_": "reduce", "argmax_": "reduce",
    "softmax_": "softmax",
    "rmsnorm_": "norm", "layernorm_": "norm", "add_rmsnorm_": "norm",
    "rope_": "rope",
    "kv_append_": "kv_cache", "qkv_rope_append_": "kv_cache",
    "attn_": "attention",
    "embedding_": "embedding",
    "silu_mul_": "activation", "gate_up_silu_": "activation",
    "decode_advance": "decode", "set_pos": "decode", "batch_advance": "decode",
    "sample_f32": "sampling", "sample_rows_f32": "sampling", "spec_accept": "sampling", "gather_drafts": "sampling",
    "ngram_lookup": "lookup", "ngram_select": "lookup", "context_append": "lookup",
    "head_": "draft_head",
    "gemv1_": "gemv", "gemv1r8_": "gemv", "gemv1r16_": "gemv", "gemv2_": "gemv", "gemv2r8_": "gemv", "gemv4_": "gemv", "gemv5_": "gemv", "gemv8_": "gemv", "gemv16_": "gemv", "gemvtc8_": "gemv", "gemvtc8w_": "gemv", "gemvtc16_": "gemv", "gemvtc16w_": "gemv",
    "gemvtcb_": "gemv", "gemvtcbw_": "gemv", "gemvtcm_": "gemv", "gemv_resnorm_rows": "gemv",
    "tree_": "tree", "topk_": "tree",
}


class CudaUnavailableError(RuntimeError):
    """Raised when the CUDA backend is asked for but no usable GPU / CuPy is present."""


_cupy: Any = None
_reason: Optional[str] = None


def _probe() -> None:
    global _cupy, _reason
    if _cupy is not None or _reason is not None:
        return
    try:
        import cupy  # noqa: PLC0415  (lazy by design)
    except Exception as e:  # ImportError, or a broken CUDA install
        _reason = f"no GPU available: CuPy is not importable ({type(e).__name__}: {e})"
        return
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        _reason = f"no GPU available: CUDA driver/runtime not usable ({type(e).__name__}: {e})"
        return
    if n < 1:
        _reason = "no GPU available: CuPy found no CUDA device"
        return
    _cupy = cupy


def cuda_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    _probe()
    return _cupy is not None


def unavailable_reason() -> str:
    """Why the GPU is not usable ('' when it is)."""
    _probe()
    return _reason or ""


def get_cupy() -> Any:
    """The cupy module; CudaUnavailableError with a one-line reason when there is no GPU."""
    _probe()
    if _cupy is None:
        raise CudaUnavailableError(_reason or "no GPU available")
    return _cupy


def cupy_or_exit(who: str) -> Any:
    """For command-line tools: the cupy module, or exit (status 1) with `who: needs a GPU (reason)`."""
    try:
        return get_cupy()
    except CudaUnavailableError as e:
        raise SystemExit(f"{who}: needs a GPU ({e})") from None


def kernel_file(name: str) -> str:
    """Which kernels/<file>.cu defines kernel `name`."""
    best = ""
    for p in KERNEL_FILES:
        if name.startswith(p) and len(p) > len(best):
            best = p
    if not best:
        raise KeyError(f"unknown CUDA kernel {name!r}")
    return KERNEL_FILES[best]


def nvrtc_source(file: str) -> str:
    """kernels/<file>.cu with its local includes inlined (so NVRTC needs no include paths)."""
    src = (SRC_DIR / f"{file}.cu").read_text()

    def inline(m: "re.Match[str]") -> str:
        inc = (SRC_DIR / "includes" / m.group(1)).read_text()
        return inc.replace("#pragma once", "")

    return re.sub(r'#include "([^"]+)"', inline, src)


class KernelLibrary:
    """Loads kernels/<file> modules on first use (fatbin, else NVRTC) and caches functions."""

    def __init__(self, build_dir: Path = BUILD_DIR, force_nvrtc: bool = False) -> None:
        self.build_dir = Path(build_dir)
        self.force_nvrtc = force_nvrtc or os.environ.get("MINITORCH_CUDA_NVRTC") == "1"
        self._modules: Dict[str, Any] = {}
        self._funcs: Dict[str, Any] = {}
        self.sources: Dict[str, str] = {}  # file -> "fatbin" | "nvrtc"

    def module(self, file: str) -> Any:
        mod = self._modules.get(file)
        if mod is not None:
            return mod
        cp = get_cupy()
        path = self.build_dir / f"{file}.fatbin"
        if path.exists() and not self.force_nvrtc:
            mod = cp.RawModule(path=str(path))
            self.sources[file] = "fatbin"
        else:
            if not self.force_nvrtc:
                print(f"minitorch: {path.name} not built (run ./compile_cuda.sh); compiling kernels/{file}.cu "
                      "with NVRTC", file=sys.stderr)
            mod = cp.RawModule(code=nvrtc_source(file), options=("-std=c++17",))
            self.sources[file] = "nvrtc"
        self._modules[file] = mod
        return mod

    def get(self, name: str) -> Any:
        fn = self._funcs.get(name)
        if fn is None:
            fn = self._funcs[name] = self.module(kernel_file(name)).get_function(name)
        return fn

    def launch(self, name: str, grid: Tuple[int, ...], block: Tuple[int, ...], args: Tuple[Any, ...],
               shared_mem: int = 0) -> None:
        """Launch kernel `name` on CuPy's current stream."""
        self.get(name)(grid, block, args, shared_mem=shared_mem)


_library: Optional[KernelLibrary] = None


def kernels() -> KernelLibrary:
    """The process-wide kernel library."""
    global _library
    if _library is None:
        _library = KernelLibrary()
    return _library
