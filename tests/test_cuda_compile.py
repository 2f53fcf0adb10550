"""compile_cuda.sh builds every kernel with nvcc (skipped where nvcc is absent) and fails loudly on a
compile error."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("NVCC", "nvcc")) is None, reason="nvcc not found")


@pytest.mark.slow
def test_compile_cuda_builds_every_kernel(tmp_path: Path) -> None:
    env = dict(os.environ, MINITORCH_CUDA_BUILD_DIR=str(tmp_path))
    res = subprocess.run([str(ROOT / "compile_cuda.sh")], capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    built = sorted(p.stem for p in tmp_path.glob("*.fatbin"))
    assert built == sorted(p.stem for p in (ROOT / "kernels").glob("*.cu"))
    assert all(p.stat().st_size > 1000 for p in tmp_path.glob("*.fatbin"))


def test_compile_error_fails_loudly(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "broken.cu").write_text('extern "C" __global__ void broken(float* x) { x[0] = undefined_name; }\n')
    env = dict(os.environ, MINITORCH_CUDA_BUILD_DIR=str(tmp_path / "out"), MINITORCH_KERNELS_DIR=str(src))
    res = subprocess.run([str(ROOT / "compile_cuda.sh")], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode != 0
    assert "FAILED to compile" in res.stderr and "undefined_name" in res.stderr
    assert not (tmp_path / "out" / "broken.fatbin").exists()
