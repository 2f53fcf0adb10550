"""CI side of the CUDA backend (no GPU needed): the module imports cleanly, `import minitorch` does
not pull in CuPy, and without a GPU the backend reports it in one line."""
from __future__ import annotations

import subprocess
import sys

import pytest

from minitorch.cuda.runtime import KERNEL_FILES, SRC_DIR, cuda_available, kernel_file, nvrtc_source


def test_import_minitorch_does_not_import_cupy() -> None:
    code = "import sys, minitorch, minitorch.cuda; print('cupy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_no_gpu_is_reported_cleanly() -> None:
    from minitorch.cuda.ops import CudaUnavailableError, make_cuda_backend

    if cuda_available():
        pytest.skip("a GPU is present")
    with pytest.raises(CudaUnavailableError, match="^no GPU available"):
        make_cuda_backend()


def test_every_kernel_prefix_names_an_existing_source() -> None:
    for file in set(KERNEL_FILES.values()):
        assert (SRC_DIR / f"{file}.cu").is_file(), file
        src = nvrtc_source(file)
        assert '#include "' not in src  # local includes inlined for NVRTC
    assert kernel_file("attn_partial_bf16") == "attention"
    assert kernel_file("add_rmsnorm_f32") == "norm"
    with pytest.raises(KeyError):
        kernel_file("nonexistent_kernel")


def test_every_source_documents_its_launch_layout() -> None:
    for path in SRC_DIR.glob("*.cu"):
        head = path.read_text()[:1500].lower()
        assert head.startswith("//") and ("launch" in head), path.name


def test_attention_kernel_choice() -> None:
    """The compact attn_partial_bf16_d64 / _d128 only where their assumptions hold (bf16, that head size,
    16-byte aligned K/V rows), the generic kernel elsewhere; every name chosen exists and is PDL-launched."""
    import re

    from minitorch.cuda.launch import ATT_FAST_HEADS, attn_partial_kernel
    from minitorch.cuda.pdl import PDL_KERNELS

    def kv(D: int, row: int) -> tuple:  # (Hkv, max_len, D) strides with `row` elements a row
        return (1000 * row, row, 1)

    assert attn_partial_kernel("bf16", 64, kv(64, 64), kv(64, 64), 0, 256) == "attn_partial_bf16_d64"
    assert attn_partial_kernel("bf16", 128, kv(128, 128), kv(128, 128), 512, 0) == "attn_partial_bf16_d128"
    assert attn_partial_kernel("bf16", 128, kv(128, 128), kv(128, 128), 0, 0, fast=False) == "attn_partial_bf16"
    assert attn_partial_kernel("bf16", 80, kv(80, 80), kv(80, 80), 0, 0) == "attn_partial_bf16"  # other head size
    assert attn_partial_kernel("f32", 64, kv(64, 64), kv(64, 64), 0, 0) == "attn_partial_f32"
    assert attn_partial_kernel("bf16", 64, kv(64, 68), kv(64, 64), 0, 0) == "attn_partial_bf16"  # rows not 16 B
    assert attn_partial_kernel("bf16", 64, kv(64, 64), kv(64, 64), 0, 8) == "attn_partial_bf16"  # unaligned base
    src = (SRC_DIR / "attention.cu").read_text()
    for D in ATT_FAST_HEADS:
        assert re.search(rf"^ATT_FAST_INST\({D}\)$", src, re.M), D
        assert f"attn_partial_bf16_d{D}" in PDL_KERNELS


def test_gpu_tools_say_they_need_a_gpu() -> None:
    """Every tools/*.py that runs kernels ends with one line, not a traceback, on a machine without a GPU."""
    import os
    from pathlib import Path

    from minitorch.cuda.runtime import unavailable_reason

    if cuda_available():
        pytest.skip("a GPU is present")
    root = Path(__file__).resolve().parents[1]
    tools = sorted(p for p in (root / "tools").glob("*.py") if "cupy" in p.read_text())
    assert len(tools) >= 2  # check_bits.py, ab_steps.py
    for tool in tools:
        out = subprocess.run([sys.executable, str(tool)], capture_output=True, text=True, cwd=root,
                             env={**os.environ, "PYTHONPATH": str(root)})
        assert out.returncode == 1 and "Traceback" not in out.stderr, (tool.name, out.stderr[-500:])
        assert out.stderr.strip().splitlines() == [f"tools/{tool.name}: needs a GPU ({unavailable_reason()})"]
