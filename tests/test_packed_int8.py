"""int8 activations with VNNI integer products (minitorch/fast_packed.py, the faster mode beside the float
reference): the kernel computes exactly its definition (per-block int8 activations, integer dot products,
float32 fold), rows do not depend on the row count, and a packed model's verify pass equals its decode
steps in this mode too."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import minitorch
from minitorch.cpu import packed as fast_packed

gguf = pytest.importorskip("gguf")
from minitorch.models.gguf_packed import pack_raw  # noqa: E402
from test_models_packed import assert_rows_match_one_row_calls, gguf_pair, random_blocks  # noqa: E402,F401

pytestmark = pytest.mark.skipif(not fast_packed.int8_supported(), reason="needs AVX2 or AVX512-VNNI")


@pytest.fixture
def int8_mode():
    old = fast_packed.set_activations("int8")
    yield
    fast_packed.set_activations(old)


def definition(x: np.ndarray, pw) -> tuple[np.ndarray, np.ndarray]:
    """(float64 value, magnitude) of the int8 mode's product, from its definition: per block b of row r,
    scale * xd[r, b] * sum_k q[k] xq[r, k] - offset * xs[r, b]."""
    n, k = pw.shape
    xq, xd, xs, _ = fast_packed.quantize_rows(x, pw.block)
    q, scale, offset = pw.codes(np.arange(n))
    qb = q.astype(np.float64).reshape(n, -1, pw.block)
    xb = xq.astype(np.float64).reshape(len(x), -1, pw.block)
    isum = np.einsum("nbk,rbk->rnb", qb, xb)  # exact integers
    terms = scale[None] * xd[:, None, :] * isum - offset[None] * xs[:, None, :]
    mag = np.abs(scale[None] * xd[:, None, :] * isum) + np.abs(offset[None] * xs[:, None, :])
    return terms.sum(-1), mag.sum(-1)


def test_quantize_rows_rounds_to_the_nearest_step() -> None:
    x = np.random.default_rng(0).standard_normal((3, 96)).astype(np.float32) * 5
    x[1, :32] = 0  # an all-zero block
    xq, xd, xs, xqs = fast_packed.quantize_rows(x, 32)
    assert np.abs(xq.astype(int)).max() <= 127
    back = (xq.reshape(3, -1, 32) * xd[:, :, None]).reshape(3, 96)
    assert np.all(np.abs(back - x) <= xd.repeat(32, 1) * 0.5001 + 1e-7)
    assert np.array_equal(xq[1, :32], np.zeros(32, np.int8)) and xd[1, 0] == 0
    np.testing.assert_allclose(xs, x.reshape(3, -1, 32).sum(-1), rtol=1e-5, atol=1e-5)
    assert np.array_equal(xqs, xq.astype(np.int32).reshape(3, -1, 32).sum(-1))


@pytest.mark.parametrize("qtype", ["Q4_K", "Q4_1", "Q6_K", "Q5_0", "Q8_0", "Q5_K"])
@pytest.mark.parametrize("rows", [1, 5, 16])
def test_int8_kernel_computes_its_definition(qtype: str, rows: int, int8_mode: None) -> None:
    """Nibble codes (Q4_K, Q4_1) and int8 codes (the others: flipped to code + 128 for vpdpbusd, 128 *
    sum(xq) taken off) against the float64 value of the mode's definition."""
    n, k = 200, 512
    pw = pack_raw(qtype, random_blocks(qtype, n, k, seed=rows), (n, k))
    assert fast_packed.int8_ready(pw)
    x = np.random.default_rng(rows).standard_normal((rows, k)).astype(np.float32)
    out = np.empty((rows, n), np.float32)
    fast_packed.packed_linear(x, pw, out)
    want, mag = definition(x, pw)
    assert np.all(np.abs(out - want) <= 2e-6 * mag + 1e-30), f"{qtype}: {np.abs(out - want).max()}"
    # and it is not the float mode (the activations were rounded)
    fast_packed.set_activations("float32")
    ref = np.empty_like(out)
    fast_packed.packed_linear(x, pw, ref)
    assert not np.array_equal(out, ref)


def test_definition_check_catches_a_broken_kernel() -> None:
    """Low and high nibbles multiplied by the wrong activation bytes (xlo, xhi swapped), and 8-bit codes
    without the +128 correction: the check fails on both."""
    n, k = 200, 512
    pw = pack_raw("Q4_K", random_blocks("Q4_K", n, k, seed=1), (n, k))
    x = np.random.default_rng(1).standard_normal((2, k)).astype(np.float32)
    xq, xd, xs, xqs = fast_packed.quantize_rows(x, pw.block)
    swapped = np.ascontiguousarray(xq.view(np.int32).reshape(2, -1, 2)[:, :, ::-1].reshape(2, -1))
    out = np.empty((2, n), np.float32)
    fast_packed.packed_rows_q8(swapped, xd, xs, xqs, *pw.tiles, pw.block, pw.per, pw.bits, n, out)
    want, mag = definition(x, pw)
    assert not np.all(np.abs(out - want) <= 2e-6 * mag + 1e-30)
    # 8-bit codes with the activation words swapped in pairs
    p6 = pack_raw("Q6_K", random_blocks("Q6_K", n, k, seed=2), (n, k))
    xq, xd, xs, xqs = fast_packed.quantize_rows(x, p6.block)
    want, mag = definition(x, p6)
    swapped = np.ascontiguousarray(xq.view(np.int32).reshape(2, -1, 2)[:, :, ::-1].reshape(2, -1))
    fast_packed.packed_rows_q8(swapped, xd, xs, xqs, *p6.tiles, p6.block, p6.per, p6.bits, n, out)
    assert not np.all(np.abs(out - want) <= 2e-6 * mag + 1e-30)
    if fast_packed.has_vnni():  # vpdpbusd's 8-bit codes without the 128 * sum(xq) correction (AVX2 takes none)
        fast_packed.packed_rows_q8(xq.view(np.int32), xd, xs, np.zeros_like(xqs), *p6.tiles, p6.block, p6.per,
                                   p6.bits, n, out)
        assert not np.all(np.abs(out - want) <= 2e-6 * mag + 1e-30)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_int8_rows_do_not_depend_on_row_count(qtype: str, int8_mode: None) -> None:
    n, k = 300, 256
    pw = pack_raw(qtype, random_blocks(qtype, n, k, seed=4), (n, k))
    x = np.random.default_rng(2).standard_normal((fast_packed.MAX_ROWS, k)).astype(np.float32)
    ones = assert_rows_match_one_row_calls(pw, x)
    # a prefill-sized call (more than MAX_ROWS rows) takes the same per-row computation, 16 rows at a time
    big = np.concatenate([x, x[::-1], x[:5]])
    out = np.empty((len(big), n), np.float32)
    fast_packed.packed_linear(big, pw, out)
    assert np.array_equal(out, np.concatenate([ones, ones[::-1], ones[:5]]))


def test_int8_mode_verify_equals_decode_steps(gguf_pair: Path, tmp_path: Path, int8_mode: None) -> None:  # noqa: F811
    from minitorch.models import load_model

    packed, _ = load_model(str(gguf_pair), progress=False, weights="packed", cache_dir=tmp_path)
    assert packed.model.layers[0].mlp.down_proj.weight.value.bits == 4  # the Q4_K tensor takes the int8 path
    ids = np.random.default_rng(0).integers(0, 400, size=21).tolist()  # a prefill of more than 16 rows
    with minitorch.no_grad():
        cache = packed.new_cache(40)
        full = packed(ids, cache).to_numpy()[0]
        first = int(full[-1].argmax())
        # prefill of all but the last token, then the last token alone (speculative decoding's prefill)
        again = packed.new_cache(40)
        packed(ids[:-1], again, last_n=1)
        assert np.array_equal(packed(ids[-1:], again).to_numpy()[0, -1], full[-1])
        start, steps, toks = cache.length, [], [first]
        for _ in range(5):
            steps.append(packed([toks[-1]], cache).to_numpy()[0, -1].copy())
            toks.append(int(steps[-1].argmax()))
        cache.truncate(start)
        verify = packed(toks[:5], cache).to_numpy()[0]
    assert np.array_equal(verify, np.stack(steps))


def test_set_activations_errors() -> None:
    with pytest.raises(ValueError, match="float32, int8"):
        fast_packed.set_activations("int4")
    assert fast_packed.get_activations() == "float32"
