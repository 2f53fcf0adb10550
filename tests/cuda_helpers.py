"""Shared helpers for the GPU tests: skip marker, bf16 bit conversion, upload/download."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from minitorch.cuda.runtime import cuda_available, unavailable_reason

needs_gpu = pytest.mark.skipif(not cuda_available(), reason=unavailable_reason() or "no GPU")

# Tolerances (stated once): fp32 kernels vs a float64 reference; bf16 kernels vs a float64
# reference computed from the same bf16-rounded inputs (one or two bf16 roundings of the output,
# 2^-8 relative each, plus fp32 accumulation order).
F32_TOL = dict(rtol=2e-5, atol=2e-5)
BF16_TOL = dict(rtol=2e-2, atol=2e-2)


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), round to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def from_bf16_bits(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b).astype(np.uint32) << 16).view(np.float32)


def round_bf16(x: np.ndarray) -> np.ndarray:
    return from_bf16_bits(to_bf16_bits(x))


def up(x: np.ndarray, dtype: str) -> Any:
    """Upload to a contiguous View of dtype ('float32' | 'bfloat16' | 'int64')."""
    import cupy as cp

    from minitorch.cuda.launch import view_of

    if dtype == "bfloat16":
        return view_of(cp.asarray(to_bf16_bits(x)), "bfloat16")
    return view_of(cp.asarray(np.ascontiguousarray(x, dtype=dtype)), dtype)


def down(v: Any) -> np.ndarray:
    """View -> float64 numpy array of its shape (strided read on the host)."""
    host = v.storage.get()
    if v.dtype == "bfloat16":
        host = from_bf16_bits(host)
    item = host.itemsize
    arr = np.lib.stride_tricks.as_strided(host, shape=v.shape, strides=[s * item for s in v.strides])
    return np.array(arr, dtype=np.float64)


def ref_in(x: np.ndarray, dtype: str) -> np.ndarray:
    """The values a kernel actually sees for input x stored as dtype."""
    return round_bf16(x).astype(np.float64) if dtype == "bfloat16" else x.astype(np.float64)


def tol(dtype: str) -> dict:
    return BF16_TOL if dtype == "bfloat16" else F32_TOL


# ---- deliberately broken kernels: a test shows its power by failing on one ----
# Each variant: (kernels/<file>.cu, [(correct text, broken text), ...]). The product kernels carry no switch for
# these; a GPU test compiles the patched source through NVRTC (use_broken_kernels) and must fail on it.
# tests/test_cuda_sources.py checks on the CPU that every correct text occurs exactly once, so a kernel
# edit that moves one fails there rather than only on a GPU.
BROKEN_KERNELS = {
    # the *_i8 GEMVs scale every row of a block by its first row's scale (tests/test_cuda_int8.py)
    "gemv_i8": ("gemv", [("wsc[r] = I8 ? __ldg(wscale + min(n0 + r, N - 1)) : 1.f;",
                          "wsc[r] = I8 ? __ldg(wscale + min(n0, N - 1)) : 1.f;")]),
    # several-token GEMVs sum a warp's lanes in another order (offsets 1, 2, .. 16): within rounding of the
    # right sums, not the one-token kernels' bits (tests/test_cuda_gemv_tokens.py)
    "gemv_rs": ("gemv", [(
        "  if constexpr (NV > 8 && NV <= 32) {  // several tokens: one reduce-scatter, the same bits\n",
        "  if constexpr (NV > 8) {\n"
        "#pragma unroll\n"
        "    for (int r = 0; r < ROWS; ++r)\n"
        "#pragma unroll\n"
        "      for (int t = 0; t < TMAX; ++t) {\n"
        "        float v = acc[r][t];\n"
        "        for (int o = 1; o < 32; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
        "        if (lane == 0) red[wid][r * TMAX + t] = v;\n"
        "      }\n"
        "  } else if constexpr (NV > 8 && NV <= 32) {\n")]),
    # tensor-core GEMV: token t's sums read token t + 1's inputs (tests/test_cuda_gemv_tokens.py)
    "gemv_tc": ("gemv", [("  const int gl = g;  // the token of this lane's A rows: g (and g + 8)\n",
                          "  const int gl = g + 1;\n")]),
    # attn_partial_bf16_d64 / _d128 drop the last key of every chunk (tests/test_cuda_attention.py)
    "attention_fast": ("attention", [("      const bool kj = sj < nk;  // a key of this chunk\n",
                                      "      const bool kj = sj < nk - 1;\n")]),
    # the batched step's attention reads the first token's sequence for every token: rows mix (tests/test_cuda_batch.py)
    "attention_rows": ("attention", [("  const i64 sb = TREE ? 0 : ROWS ? (i64)tslot[b] : (i64)b;\n",
                                      "  const i64 sb = TREE ? 0 : ROWS ? (i64)tslot[0] : (i64)b;\n")]),
    # a draft tree's rows read the step's rows in slot order, not their own paths: siblings' keys and values, past
    # the root (tests/test_cuda_tree.py)
    "attention_tree": ("attention", [("    if constexpr (TREE) return v < base ? (i64)v : (i64)base + tanc[b * tw + (v - base)];\n",
                                      "    if constexpr (TREE) return (i64)v;\n")]),
    # prompt lookup takes the earliest match instead of the latest (tests/test_cuda_lookup.py)
    "lookup": ("lookup", [("    if (tid == 0) *best = -1;\n", "    if (tid == 0) *best = 0x7fffffff;\n"),
                          ("      int s = top - tid;\n", "      int s = (N - n - 1) - top + tid;\n"),
                          ("      if (hit) atomicMax(best, s);  // the latest match\n",
                           "      if (hit) atomicMin(best, s);\n")]),
}


def broken_source(variant: str) -> tuple[str, str]:
    """(kernel file, its NVRTC source with the variant's patches applied); each correct text must occur once."""
    from minitorch.cuda.runtime import nvrtc_source

    file, patches = BROKEN_KERNELS[variant]
    src = nvrtc_source(file)
    for good, bad in patches:
        n = src.count(good)
        assert n == 1, f"{variant}: {good.strip()!r} occurs {n} times in kernels/{file}.cu (expected once)"
        src = src.replace(good, bad)
    return file, src


_BROKEN_BUILDS: dict = {}  # variant -> the fatbin nvcc built from its source (once a session)


def broken_module(variant: str, file: str, code: str) -> "tuple[Any, str]":
    """(module, how it was built) of a broken source, built as the real kernels are where nvcc is on PATH (nvcc
    -fatbin -O3, compile_cuda.sh's flags, for this GPU's architecture), else by NVRTC. The real build is nvcc's, so
    a broken variant goes through the same compiler as the kernels it stands in for."""
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    from minitorch.cuda import runtime

    cp = runtime.get_cupy()
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return cp.RawModule(code=code, options=("-std=c++17",)), "nvrtc"
    path = _BROKEN_BUILDS.get(variant)
    if path is None:
        cc = str(cp.cuda.Device().compute_capability)
        d = Path(tempfile.mkdtemp(prefix=f"minitorch_broken_{variant}_"))
        (d / f"{file}.cu").write_text(code)
        path = d / f"{file}.fatbin"
        subprocess.run([nvcc, "-fatbin", "-O3", "-std=c++17", f"-gencode=arch=compute_{cc},code=sm_{cc}", "-o",
                        str(path), str(d / f"{file}.cu")], check=True, capture_output=True, text=True)
        _BROKEN_BUILDS[variant] = path
    return cp.RawModule(path=str(path)), "nvcc"


def use_broken_kernels(monkeypatch: Any, variant: str) -> None:
    """Make every kernel launch of this test use a library whose `file` module is built from the broken source
    (broken_module); the other files load as usual. Objects that fetched kernels before the call keep the real ones."""
    from minitorch.cuda import runtime

    file, code = broken_source(variant)

    class Patched(runtime.KernelLibrary):
        def module(self, name: str) -> Any:
            if name != file:
                return super().module(name)
            mod = self._modules.get(name)
            if mod is None:
                mod, how = broken_module(variant, file, code)
                self._modules[name] = mod
                self.sources[name] = f"{how} ({variant} broken)"
            return mod

    monkeypatch.setattr(runtime, "_library", Patched())
