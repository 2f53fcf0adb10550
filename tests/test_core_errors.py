"""Bad input raises MiniTorchError naming shapes / dims (never a numba crash or a silent wrong
answer), and `import minitorch` pulls in no torch / transformers / cupy."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import minitorch
from minitorch import MiniTorchError, nn
from backends import BACKENDS

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_shapes_and_dims(backend):
    z = lambda *s: minitorch.zeros(s, backend=backend)  # noqa: E731
    with pytest.raises(MiniTorchError, match=r"\(2, 3\).*\(4,\)"):
        z(2, 3) + z(4)
    with pytest.raises(MiniTorchError, match=r"\(2, 3\) @ \(4, 5\)"):
        z(2, 3) @ z(4, 5)
    with pytest.raises(MiniTorchError, match=r">= 2-d"):
        z(3) @ z(3, 2)
    with pytest.raises(MiniTorchError, match=r"dim 2 out of range.*\(2, 3\)"):
        z(2, 3).sum(2)
    with pytest.raises(MiniTorchError, match=r"dim -3"):
        nn.softmax(z(2, 3), -3)
    with pytest.raises(MiniTorchError, match=r"\(2, 3\).*\(4,\)"):
        z(2, 3).view(4)
    with pytest.raises(MiniTorchError, match="permute"):
        z(2, 3).permute(0, 0)
    with pytest.raises(MiniTorchError, match="narrow"):
        z(2, 3).narrow(1, 2, 2)
    with pytest.raises(MiniTorchError, match="index 5 out of range"):
        z(2, 3)[0, 5]
    with pytest.raises(MiniTorchError, match=r"\(3,\) to \(2, 2\)"):
        z(2, 2).copy_(z(3))
    with pytest.raises(MiniTorchError, match="expected \\(3,\\)"):
        nn.rmsnorm(z(2, 3), z(4))
    with pytest.raises(MiniTorchError, match="query heads"):
        nn.attention(z(1, 3, 1, 4), z(1, 2, 1, 4), z(1, 2, 1, 4))
    with pytest.raises(MiniTorchError, match="keys length 2 < q_start 2"):
        nn.attention(z(1, 2, 1, 4), z(1, 2, 2, 4), z(1, 2, 2, 4), None, 2)
    with pytest.raises(MiniTorchError, match="even D"):
        nn.rope(z(1, 2, 3), z(2, 3), z(2, 3))
    with pytest.raises(MiniTorchError, match=r"expand shape \(2, 3\)"):
        z(2, 3).expand(-1, 2, 3)
    with pytest.raises(MiniTorchError, match=r"\(2, 3\) to \(4, 3\)"):
        z(2, 3).expand(4, 3)
    with pytest.raises(MiniTorchError, match="differ off that dim"):
        nn.cat([z(2, 3), z(3, 3)], 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dtype_misuse(backend):
    ids = minitorch.tensor([[0, 7]], dtype="int64", backend=backend)
    w = minitorch.zeros((5, 3), backend=backend)
    with pytest.raises(MiniTorchError, match="id 7 out of range for 5 rows"):
        nn.embedding(w, ids)
    with pytest.raises(MiniTorchError, match="must be int64"):
        nn.embedding(w, ids.float())
    with pytest.raises(MiniTorchError, match="float tensor.*int64"):
        nn.softmax(ids, -1)
    with pytest.raises(MiniTorchError, match="dtype mismatch"):
        ids @ minitorch.zeros((2, 2), backend=backend)
    with pytest.raises(MiniTorchError, match="not supported"):
        minitorch.zeros((2,), backend=backend, dtype="float16")


@pytest.mark.parametrize("backend", BACKENDS)
def test_writing_into_read_only_storage(backend):
    if backend.cuda:
        pytest.skip("host arrays only")
    arr = np.zeros((2, 3), np.float32)
    arr.flags.writeable = False
    t = minitorch.from_numpy(arr, backend=backend)
    assert (t + 1.0).to_numpy().sum() == 6.0          # reading is fine
    with pytest.raises(MiniTorchError, match=r"read-only tensor of shape \(2, 3\)"):
        t.copy_(minitorch.ones((2, 3), backend=backend))
    with pytest.raises(MiniTorchError, match="read-only"):
        backend.add_zip(t, t, out=t)


def test_error_is_valueerror():
    assert issubclass(MiniTorchError, ValueError)


def test_import_does_not_load_torch_transformers_cupy():
    code = ("import sys, minitorch, minitorch.nn; "
            "bad = [m for m in ('torch', 'transformers', 'cupy') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stdout + r.stderr
