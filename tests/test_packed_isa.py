"""The packed kernels' instruction-set paths give the same bits (minitorch/cpu/packed.py): AVX-512 (vpermps
table lookup, vpdpbusd) where the CPU has it, generic IR and AVX2 integer products (pmaddubsw + pmaddwd)
elsewhere. A subprocess forced onto the AVX2 paths (MINITORCH_CPU_ISA=avx2, its own numba cache) must
reproduce this process's products bit for bit, float32 and int8 activations, 4-bit, 6-bit and 8-bit codes
(Q6_K and Q5_K pack to 6 bits; each also as its int8-code form, which must give the same bits on either path).
On an AVX2-only machine both sides take the same path, and the check still pins the results to each other."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minitorch.cpu import packed as fast_packed

pytest.importorskip("gguf")
from minitorch.models.gguf_packed import pack_raw  # noqa: E402
from test_models_packed import random_blocks  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# 11 and 16 rows: on the AVX2 side in groups of 4 (packed.py ROW_GROUP), on an AVX-512 host in one body
CASES = [("Q4_K", 1), ("Q4_K", 5), ("Q4_K", 11), ("Q6_K", 1), ("Q6_K", 5), ("Q6_K", 16), ("Q5_K", 3)]
SCRIPT = """
import sys
import numpy as np
sys.path.insert(0, {tests!r})
from minitorch.cpu import packed as fp
from minitorch.models.gguf_packed import pack_raw
from test_models_packed import random_blocks
assert not fp.host_avx512() and not fp.has_vnni()
out = {{}}
for qtype, rows in {cases!r}:
    pw = pack_raw(qtype, random_blocks(qtype, 200, 512, seed=3), (200, 512))
    x = np.random.default_rng(rows).standard_normal((rows, 512)).astype(np.float32)
    for mode in ("float32", "int8"):
        fp.set_activations(mode)
        for form in {{pw.bits, 8}}:
            o = np.empty((rows, 200), np.float32)
            fp.packed_linear(x, pw.recoded(form), o)
            out[f"{{qtype}}_{{rows}}_{{mode}}_{{form}}"] = o
np.savez({dst!r}, **out)
"""


def products() -> dict[str, np.ndarray]:
    out = {}
    for qtype, rows in CASES:
        pw = pack_raw(qtype, random_blocks(qtype, 200, 512, seed=3), (200, 512))
        x = np.random.default_rng(rows).standard_normal((rows, 512)).astype(np.float32)
        for mode in ("float32", "int8"):
            old = fast_packed.set_activations(mode)
            try:
                for form in {pw.bits, 8}:
                    o = np.empty((rows, 200), np.float32)
                    fast_packed.packed_linear(x, pw.recoded(form), o)
                    out[f"{qtype}_{rows}_{mode}_{form}"] = o
            finally:
                fast_packed.set_activations(old)
    return out


@pytest.mark.skipif(not fast_packed.int8_supported(), reason="needs an x86 CPU with AVX2")
def test_avx2_paths_give_the_same_bits(tmp_path: Path) -> None:
    dst = tmp_path / "avx2.npz"
    env = dict(os.environ, MINITORCH_CPU_ISA="avx2", NUMBA_CACHE_DIR=str(tmp_path / "numba"),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = SCRIPT.format(tests=str(ROOT / "tests"), cases=CASES, dst=str(dst))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    theirs = dict(np.load(dst))
    mine = products()
    assert sorted(theirs) == sorted(mine)
    for key, want in mine.items():
        assert np.array_equal(theirs[key], want), key
    for key in mine:  # the 6-bit form gives its int8-code form's bits on both paths
        if key.endswith("_6"):
            assert np.array_equal(mine[key], mine[key[:-2] + "_8"]), key
            assert np.array_equal(theirs[key], theirs[key[:-2] + "_8"]), key
    # every 6-bit case (Q6_K, Q5_K) in both activation modes was compared
    assert sum(key.endswith("_6") for key in mine) == 2 * sum(q in ("Q6_K", "Q5_K") for q, _ in CASES)


def test_isa_override_hides_avx512(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINITORCH_CPU_ISA", "avx2")
    assert not fast_packed.host_avx512() and not fast_packed.has_vnni()
    assert not any(k.startswith("avx512") for k in fast_packed._isa())
