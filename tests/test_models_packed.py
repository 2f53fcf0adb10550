"""Packed GGUF weights (minitorch/packed.py, minitorch/models/gguf_packed.py, minitorch/cpu/packed.py):
the packed form rebuilds gguf's own dequantization bit for bit for every packed type, the numba kernel
matches the float32 reference and is row-count independent, and a packed model equals the float32 model."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import minitorch
from minitorch import FastBackend, SimpleBackend, nn
from minitorch.models import load_model
from minitorch.models.errors import ModelLoadError
from minitorch.models.gguf_packed import PACKED_TYPES, pack_raw
from minitorch.packed import PackedWeight

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType  # noqa: E402
from gguf.constants import GGML_QUANT_SIZES  # noqa: E402

# byte offsets of the fp16 fields in one block of each type (the rest is codes and 6/8-bit scales)
F16_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q5_0": (0,), "Q4_1": (0, 2), "Q5_1": (0, 2),
              "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
# the code form each type packs to (minitorch/packed.py): nibbles for 0..15, 6 bits for -32..31, else int8
BITS = {"Q4_K": 4, "Q4_1": 4, "Q8_0": 8, "Q4_0": 6, "Q5_0": 6, "Q5_1": 6, "Q5_K": 6, "Q6_K": 6}


def random_blocks(qtype: str, n: int, k: int, seed: int) -> np.ndarray:
    """Random raw bytes for an (n, k) tensor of `qtype`, fp16 fields set to finite values of either sign."""
    per, size = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(n * k // per, size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        vals = (rng.uniform(-1, 1, size=blocks.shape[0]) * 10.0 ** rng.integers(-4, 1, size=blocks.shape[0]))
        blocks[:, off:off + 2] = vals.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return blocks.reshape(n, -1)


@pytest.mark.parametrize("qtype", PACKED_TYPES)
def test_packed_form_rebuilds_gguf_dequantization_bit_for_bit(qtype: str) -> None:
    n, k = 6, 512
    raw = random_blocks(qtype, n, k, seed=len(qtype) + ord(qtype[1]))
    want = gguf.quants.dequantize(raw, GGMLQuantizationType[qtype]).reshape(n, k)
    pw = pack_raw(qtype, raw, (n, k))
    assert pw.bits == BITS[qtype] and pw.qt.dtype == (np.int8 if qtype == "Q8_0" else np.uint32)
    assert pw.block in (16, 32)
    assert np.array_equal(pw.dequantize(), want), f"{qtype}: packed values differ from gguf's dequantization"
    assert np.array_equal(pw.rows(np.array([[4, 0]])), want[[4, 0]][None])  # embedding rows


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q5_0", "Q8_0"])
@pytest.mark.parametrize("rows", [1, 2, 5, 16, 40])
def test_fast_kernel_matches_float32_reference(qtype: str, rows: int) -> None:
    n, k = 70, 768  # n not a multiple of the kernel's chunk; 40 rows takes the prefill (BLAS) path
    pw = pack_raw(qtype, random_blocks(qtype, n, k, seed=rows), (n, k))
    x = np.random.default_rng(rows).standard_normal((rows, k)).astype(np.float32)
    ref = x.astype(np.float64) @ pw.dequantize().T.astype(np.float64)
    for backend in (FastBackend, SimpleBackend):
        with minitorch.no_grad():
            y = nn.linear(minitorch.from_numpy(x, backend=backend), pw).to_numpy()
        scale = np.abs(x).max() * np.abs(pw.dequantize()).sum(1).max()
        np.testing.assert_allclose(y, ref, rtol=0, atol=1e-6 * scale, err_msg=f"{backend.name}")


def test_fast_kernel_rows_do_not_depend_on_row_count() -> None:
    """Row t of a T-row product is the 1-row product bit for bit (verify pass == decode steps)."""
    pw = pack_raw("Q4_K", random_blocks("Q4_K", 37, 512, seed=3), (37, 512))
    x = np.random.default_rng(0).standard_normal((6, 512)).astype(np.float32)
    with minitorch.no_grad():
        many = nn.linear(minitorch.from_numpy(x, backend=FastBackend), pw).to_numpy()
        for t in range(6):
            one = nn.linear(minitorch.from_numpy(x[t:t + 1].copy(), backend=FastBackend), pw).to_numpy()
            assert np.array_equal(one[0], many[t]), f"row {t}"


def assert_rows_match_one_row_calls(pw: PackedWeight, x: np.ndarray) -> np.ndarray:
    """For every R in 1..len(x): the packed kernel's R-row product of x[:R] equals its 1-row products bit for
    bit; returns the 1-row products (len(x), N)."""
    from minitorch.cpu import packed as fast_packed

    n = pw.shape[0]
    ones = np.empty((len(x), n), np.float32)
    for r in range(len(x)):
        fast_packed.packed_linear(x[r:r + 1].copy(), pw, ones[r:r + 1])
    for rows in range(1, len(x) + 1):
        out = np.empty((rows, n), np.float32)
        fast_packed.packed_linear(x[:rows].copy(), pw, out)
        assert np.array_equal(out, ones[:rows]), f"{rows} rows"
    return ones


@pytest.mark.parametrize("block", [16, 9])
def test_fast_kernel_rows_match_one_row_calls_for_every_row_count(block: int) -> None:
    """Every R the row kernel takes (1..MAX_ROWS), an odd block (the single-input tail after the pairs)
    and a partial last tile: row r of the R-row product is the 1-row product bit for bit, and one thread
    gives the same bits as all of them."""
    import numba

    from minitorch.cpu import packed as fast_packed

    n, k = 300, 144
    rng = np.random.default_rng(block)
    pw = PackedWeight.quantize(rng.standard_normal((n, k)).astype(np.float32), block=block)
    x = rng.standard_normal((fast_packed.MAX_ROWS, k)).astype(np.float32)
    ones = assert_rows_match_one_row_calls(pw, x)
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        one_thread = np.empty_like(ones)
        fast_packed.packed_linear(x, pw, one_thread)
    finally:
        numba.set_num_threads(threads)
    assert np.array_equal(one_thread, ones)


@pytest.mark.parametrize("n, k, block", [(300, 96, 32), (129, 40, 5), (256, 48, 16), (3, 18, 9)])
@pytest.mark.parametrize("rows", [1, 3, 17])
def test_kernel_over_tiles_and_odd_blocks(n: int, k: int, block: int, rows: int) -> None:
    """Several tiles with a partial last one, and odd block lengths (the kernel's single-input tail)."""
    rng = np.random.default_rng(n + rows)
    pw = PackedWeight.quantize(rng.standard_normal((n, k)).astype(np.float32), block=block)
    pw = PackedWeight(*pw.codes(np.arange(n)), block=block)  # round trip through the row-major form
    x = rng.standard_normal((rows, k)).astype(np.float32)
    ref = x.astype(np.float64) @ pw.dequantize().T.astype(np.float64)
    with minitorch.no_grad():
        y = nn.linear(minitorch.from_numpy(x, backend=FastBackend), pw).to_numpy()
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-5 * np.abs(x).max() * np.abs(pw.dequantize()).sum(1).max())


def test_packed_narrow_shares_tiles_or_copies() -> None:
    from minitorch.packed import TILE

    w = np.random.default_rng(0).standard_normal((TILE * 2 + 9, 64)).astype(np.float32)
    pw = PackedWeight.quantize(w)
    full = pw.dequantize()
    for start, length in ((0, 40), (TILE, TILE + 9), (3, 200), (TILE * 2, 9)):
        part = pw.narrow(0, start, length)
        assert part.shape == (length, 64)
        assert np.array_equal(part.dequantize(), full[start:start + length]), (start, length)
        assert np.shares_memory(part.qt, pw.qt) == (start % TILE == 0)
    with pytest.raises(minitorch.MiniTorchError, match="outside"):
        pw.narrow(0, 200, 100)


def test_packed_weight_errors() -> None:
    w = np.ones((4, 64), np.float32)
    pw = PackedWeight.quantize(w)
    np.testing.assert_array_equal(pw.dequantize(), w)
    with pytest.raises(minitorch.MiniTorchError, match="does not match weight"):
        nn.linear(minitorch.ones((2, 32), backend=FastBackend), pw)
    x = minitorch.ones((2, 64), backend=FastBackend).requires_grad_(True)
    with pytest.raises(minitorch.MiniTorchError, match="inference-only"):
        nn.linear(x, pw)
    with pytest.raises(minitorch.MiniTorchError, match="block 32 x 1 does not divide"):
        PackedWeight(np.zeros((2, 48), np.int8), np.zeros((2, 1), np.float32), np.zeros((2, 1), np.float32), 32)
    with pytest.raises(minitorch.MiniTorchError, match="embedding ids"):
        pw.rows(np.array([4]))
    with pytest.raises(minitorch.MiniTorchError, match="cannot hold"):
        PackedWeight.from_tiles(*pw.tiles, pw.block, pw.per, pw.bits, 200)
    with pytest.raises(minitorch.MiniTorchError, match="tiles must be int8"):
        PackedWeight.from_tiles(pw.qt[:, :, :8], *pw.tiles[1:], pw.block, pw.per, pw.bits, 4)


@pytest.fixture(scope="module")
def gguf_pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny qwen2 GGUF with 256-wide rows: Q8_0 weights, plus a Q4_K, a Q6_K and a Q5_0 tensor."""
    torch = pytest.importorskip("torch")  # noqa: F841  (the helper builds the model with transformers)
    from test_models_util import hf_qwen2, tiny_bpe, write_gguf

    hf = hf_qwen2(seed=5, hidden_size=256, num_attention_heads=4, num_key_value_heads=2, intermediate_size=256,
                  num_hidden_layers=2, tie_word_embeddings=False)
    d = 256
    raw = {"blk.0.ffn_down.weight": (random_blocks("Q4_K", d, d, 1), GGMLQuantizationType.Q4_K),
           "blk.1.attn_q.weight": (random_blocks("Q6_K", d, d, 2), GGMLQuantizationType.Q6_K),
           "blk.1.ffn_up.weight": (random_blocks("Q5_0", d, d, 3), GGMLQuantizationType.Q5_0)}
    for name, (blocks, t) in raw.items():  # keep the random weights small, like trained ones
        per, size = GGML_QUANT_SIZES[t]
        b = blocks.reshape(-1, size)
        for off in F16_FIELDS[t.name]:
            b[:, off:off + 2] = (b[:, off:off + 2].copy().view(np.float16) * np.float16(0.01)).view(np.uint8)
    return write_gguf(tmp_path_factory.mktemp("packed") / "tiny.gguf", hf, tiny_bpe(), qtype="Q8_0", raw_override=raw)


def test_packed_model_equals_float32_model(gguf_pair: Path, tmp_path: Path) -> None:
    packed, _ = load_model(str(gguf_pair), progress=False, weights="packed", cache_dir=tmp_path)
    dense, _ = load_model(str(gguf_pair), progress=False, weights="float32", cache_dir=tmp_path)
    default, _ = load_model(str(gguf_pair), progress=False, cache_dir=tmp_path)
    assert isinstance(packed.model.layers[0].mlp.down_proj.weight.value, PackedWeight)
    assert isinstance(default.model.layers[1].self_attn.q_proj.weight.value, PackedWeight)  # auto: packed here
    assert not isinstance(dense.model.layers[0].mlp.down_proj.weight.value, PackedWeight)
    ids = np.random.default_rng(0).integers(0, 400, size=9).tolist()
    with minitorch.no_grad():
        cp, cd = packed.new_cache(32), dense.new_cache(32)
        lp, ld = packed(ids, cp).to_numpy()[0], dense(ids, cd).to_numpy()[0]
        np.testing.assert_allclose(lp, ld, atol=1e-4, rtol=0)
        # decode 5 tokens one at a time, then the same 5 as one verify pass from the same cache: bit-equal
        start, steps = cp.length, []
        toks = [int(lp[-1].argmax())]
        for _ in range(5):
            steps.append(packed([toks[-1]], cp).to_numpy()[0, -1].copy())
            toks.append(int(steps[-1].argmax()))
        cp.truncate(start)
        verify = packed(toks[:5], cp).to_numpy()[0]
    assert np.array_equal(verify, np.stack(steps)), "a packed verify pass differs from the decode steps"


def test_packed_load_needs_no_float32_cache(gguf_pair: Path, tmp_path: Path) -> None:
    """The packed cache folder is self-contained (tiles, small float tensors, config, tokenizer): loading
    packed writes no dequantized float32 copy, and a second load reuses the folder."""
    model, tok = load_model(str(gguf_pair), progress=False, weights="packed", cache_dir=tmp_path)
    assert not (tmp_path / "dequant").exists()
    [folder] = (tmp_path / "packed").iterdir()
    stamp = (folder / "packed.json").stat().st_mtime_ns
    again, tok2 = load_model(str(gguf_pair), progress=False, weights="packed", cache_dir=tmp_path)
    assert (folder / "packed.json").stat().st_mtime_ns == stamp
    assert tok.encode("hello") == tok2.encode("hello")
    assert isinstance(again.model.norm.weight.value, minitorch.Tensor)


def test_packed_load_errors(gguf_pair: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="weights must be"):
        load_model(str(gguf_pair), progress=False, weights="int4", cache_dir=tmp_path)

    class NoPacked:  # a backend without a packed kernel (like CUDA)
        name, packed_linear = "NoPacked", None

    with pytest.raises(ModelLoadError, match="no packed kernel"):
        load_model(str(gguf_pair), backend=NoPacked, progress=False, weights="packed", cache_dir=tmp_path)


def test_auto_weights_are_float32_without_a_packed_kernel(gguf_pair: Path, tmp_path: Path) -> None:
    import copy

    backend = copy.copy(FastBackend)
    backend.packed_linear = None  # as on CUDA
    model, _ = load_model(str(gguf_pair), backend=backend, progress=False, cache_dir=tmp_path)
    assert not isinstance(model.model.layers[0].mlp.down_proj.weight.value, PackedWeight)
    assert not (tmp_path / "packed").exists()


def test_kernel_rebuilds_the_float32_weights_exactly() -> None:
    """One-hot activations read single weights out of the kernel: its row rebuild (scale * code - offset,
    two roundings) gives the dequantized float32 weights bit for bit, offsets included."""
    from minitorch.cpu import packed as fast_packed

    for qtype in ("Q4_K", "Q6_K", "Q4_1"):
        pw = pack_raw(qtype, random_blocks(qtype, 24, 256, seed=7), (24, 256))
        w = pw.dequantize()
        for k0 in range(0, 256, 16):
            x = np.zeros((16, 256), np.float32)
            x[np.arange(16), k0 + np.arange(16)] = 1.0
            out = np.empty((16, 24), np.float32)
            fast_packed.packed_linear(x, pw, out)
            assert np.array_equal(out, w[:, k0:k0 + 16].T), f"{qtype} columns {k0}..{k0 + 15}"


def test_packed_head_rows_narrow_the_packed_head(gguf_pair: Path, tmp_path: Path) -> None:
    packed, _ = load_model(str(gguf_pair), progress=False, weights="packed", cache_dir=tmp_path)
    ids = [3, 1, 4, 1, 5]
    with minitorch.no_grad():
        full = packed(ids).to_numpy()[0]
        part = packed(ids, head_rows=40).to_numpy()[0]
    assert np.array_equal(part, full[:, :40])
    with pytest.raises(minitorch.MiniTorchError, match="dim 0"):
        packed.lm_head.weight.value.narrow(1, 0, 4)


@pytest.mark.parametrize("bug", ["last-output-unwritten", "one-block-scale-off"])
def test_kernel_reference_check_catches_kernel_slips(bug: str, monkeypatch) -> None:
    """The float64-reference check above fails on a kernel whose loop over the weight's rows stops one short
    (the last output column left at 0) and on one whose first block of each row is scaled 1% off (a 1/24
    share of each dot product 1% off)."""
    real = FastBackend.packed_linear

    def broken(x, w, out):
        real(x, w, out)
        if bug == "last-output-unwritten":
            out[:, -1] = 0.0
        else:
            first = np.asarray(x)[:, :w.block].astype(np.float64) @ w.dequantize()[:, :w.block].T.astype(np.float64)
            out += (0.01 * first).astype(np.float32)

    monkeypatch.setattr(FastBackend, "packed_linear", broken)
    qtype, rows, n, k = "Q4_K", 5, 70, 768
    pw = pack_raw(qtype, random_blocks(qtype, n, k, seed=rows), (n, k))
    x = np.random.default_rng(rows).standard_normal((rows, k)).astype(np.float32)
    ref = x.astype(np.float64) @ pw.dequantize().T.astype(np.float64)
    with minitorch.no_grad():
        y = nn.linear(minitorch.from_numpy(x, backend=FastBackend), pw).to_numpy()
    scale = np.abs(x).max() * np.abs(pw.dequantize()).sum(1).max()
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(y, ref, rtol=0, atol=1e-6 * scale)


def one_hot_readout(pw: PackedWeight) -> np.ndarray:
    """The (N, K) weights as the fast kernel sees them: one-hot activations, 16 inputs per call."""
    from minitorch.cpu import packed as fast_packed

    n, k = pw.shape
    got = np.empty((n, k), np.float32)
    for k0 in range(0, k, 16):
        x = np.zeros((16, k), np.float32)
        x[np.arange(16), k0 + np.arange(16)] = 1.0
        out = np.empty((16, n), np.float32)
        fast_packed.packed_linear(x, pw, out)
        got[:, k0:k0 + 16] = out.T
    return got


@pytest.mark.parametrize("qtype", ["Q4_K", "Q4_1", "Q5_K", "Q6_K", "Q8_0"])
def test_compact_form_reads_gguf_weights_bit_for_bit(qtype: str) -> None:
    """The nibble codes (Q4_K, Q4_1), the 6-bit codes (Q5_K, Q6_K) and the int8 block scales under super-block
    factors (K-quants), read out by the kernel with one-hot activations, are gguf's own dequantized weights bit
    for bit."""
    n, k = 130, 512  # two tiles, the second partial
    raw = random_blocks(qtype, n, k, seed=11)
    want = gguf.quants.dequantize(raw, GGMLQuantizationType[qtype]).reshape(n, k)
    pw = pack_raw(qtype, raw, (n, k))
    assert pw.bits == BITS[qtype]
    assert pw.per == {"Q4_K": 8, "Q5_K": 8, "Q6_K": 16}.get(qtype, 1)
    assert np.array_equal(one_hot_readout(pw), want)


def test_compact_form_bytes_per_weight() -> None:
    """Q4_K: 0.5 (nibbles) + 2/32 (sc, m) + 8/256 (d, dmin) bytes a weight; Q6_K 0.75 (6 bits) + 1/16 + 4/256
    (1 + 1/16 + 4/256 with int8 codes); the first form (int8 codes, float32 scale and offset per block) read
    1.25 and 1.5."""
    from minitorch.packed import TILE

    n, k = 2 * TILE, 512
    q4 = pack_raw("Q4_K", random_blocks("Q4_K", n, k, 1), (n, k))
    q6 = pack_raw("Q6_K", random_blocks("Q6_K", n, k, 2), (n, k))
    assert q4.nbytes == n * k * (0.5 + 2 / 32 + 8 / 256)
    assert q6.nbytes == n * k * (0.75 + 1 / 16 + 4 / 256)
    assert q6.recoded(8).nbytes == n * k * (1 + 1 / 16 + 4 / 256)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q4_1", "Q6_K"])
def test_compact_kernel_equals_int8_float_scale_kernel_bit_for_bit(qtype: str) -> None:
    """The same weight as nibbles + compact scales and as the previous form (int8 codes, float32 scale and
    offset per block) gives the same bits for every row count the row kernel takes and on the prefill
    path: the product chain is the same, only the bytes it reads differ."""
    from minitorch.cpu import packed as fast_packed

    n, k = 200, 512
    pw = pack_raw(qtype, random_blocks(qtype, n, k, seed=5), (n, k))
    old = PackedWeight(*pw.codes(np.arange(n)), block=pw.block, bits=8)
    assert old.bits == 8 and old.per == 1 and old.nbytes > pw.nbytes
    x = np.random.default_rng(1).standard_normal((40, k)).astype(np.float32)
    for rows in list(range(1, fast_packed.MAX_ROWS + 1)) + [40]:
        a, b = np.empty((rows, n), np.float32), np.empty((rows, n), np.float32)
        fast_packed.packed_linear(x[:rows].copy(), pw, a)
        fast_packed.packed_linear(x[:rows].copy(), old, b)
        assert np.array_equal(a, b), f"{qtype}: {rows} rows"


def test_exactness_checks_catch_a_broken_packing() -> None:
    """The bit-for-bit checks above fail on deliberately broken forms: nibbles in the wrong order, and
    block scales read under the wrong super-block factor."""
    n, k = 130, 512
    raw = random_blocks("Q4_K", n, k, seed=11)
    want = gguf.quants.dequantize(raw, GGMLQuantizationType.Q4_K).reshape(n, k)
    pw = pack_raw("Q4_K", raw, (n, k))
    assert np.array_equal(one_hot_readout(pw), want)
    swapped = ((pw.qt >> 4) & np.uint32(0x0F0F0F0F)) | ((pw.qt << 4) & np.uint32(0xF0F0F0F0))
    broken = PackedWeight.from_tiles(swapped, *pw.tiles[1:], pw.block, pw.per, pw.bits, n)
    assert not np.array_equal(one_hot_readout(broken), want)
    shifted = np.ascontiguousarray(np.roll(pw.d, 1, axis=1))  # block b under super-block b // per - 1
    broken = PackedWeight.from_tiles(pw.qt, pw.sc, shifted, pw.m, pw.dmin, pw.block, pw.per, pw.bits, n)
    assert not np.array_equal(one_hot_readout(broken), want)
    assert not np.array_equal(broken.dequantize(), want)


# ---- 4-bit requantization of a draft (load_model(requantize=4), --draft-quant) ------------------------------
@pytest.mark.parametrize("per", [1, 4, 8])
def test_quantize4_error_and_kernel(per: int) -> None:
    """quantize4 keeps every weight within its block's quantization step of the original (codes 0..15 on
    an int8-scaled grid), and the packed kernel computes x @ w4^T with w4 its dequantized values."""
    r = np.random.default_rng(per)
    w = (r.standard_normal((300, 512)) * np.exp(r.standard_normal((300, 1)))).astype(np.float32)
    w[7, :32] = 0.0  # an all-zero block
    w[9, 32:64] = np.abs(w[9, 32:64]) + 1.0  # an all-positive block (negative offset code)
    pw = PackedWeight.quantize4(w, 32, per)
    assert pw.bits == 4 and pw.per == per
    w4 = pw.dequantize()
    b = w.reshape(300, -1, 32)
    step = ((b.max(2) - b.min(2)) / 15)[:, :, None]
    # rounding to the code grid (half a step) + the int8 rounding of the scale (<= 15 codes x d / 2) and of the
    # offset (dmin / 2): at most ~1.3 steps for blocks of a typical range in the group
    err = np.abs(w4 - w).reshape(300, -1, 32)
    d = np.repeat(pw.tiles[2].transpose(0, 2, 1).reshape(-1, 512 // (32 * per))[:300], per, axis=1)[:, :, None]
    dmin = np.repeat(pw.tiles[4].transpose(0, 2, 1).reshape(-1, 512 // (32 * per))[:300], per, axis=1)[:, :, None]
    assert np.all(err <= 0.5 * step + 7.5 * d + 0.5 * dmin + 1e-6)
    assert np.all(w4[7, :32] == 0)
    assert np.sqrt(np.mean((w4 - w) ** 2)) / np.std(w) < 0.1
    x = r.standard_normal((3, 512)).astype(np.float32)
    out = np.empty((3, 300), np.float32)
    from minitorch.cpu.packed import packed_linear as fast

    fast(x, pw, out)
    np.testing.assert_allclose(out, x.astype(np.float64) @ w4.T.astype(np.float64), rtol=1e-4, atol=1e-4)


def test_requantized_draft_keeps_speculative_exact(gguf_pair: Path, tmp_path: Path) -> None:
    """load_model(requantize=4): the 6- and 8-bit-code tensors become 4-bit (the 4-bit Q4_K one stays as stored),
    cached in a folder of their own; as a draft it changes acceptance, never the output."""
    from minitorch.generation import generate, speculative_generate

    target, _ = load_model(str(gguf_pair), progress=False, weights="packed", cache_dir=tmp_path)
    draft, _ = load_model(str(gguf_pair), progress=False, weights="packed", cache_dir=tmp_path, requantize=4)
    assert sorted(p.name for p in (tmp_path / "packed").iterdir())[1].endswith("-q4")
    w8, w4 = target.model.layers[1].mlp.up_proj.weight.value, draft.model.layers[1].mlp.up_proj.weight.value
    assert w8.bits == 6 and w4.bits == 4 and w4.nbytes < 0.7 * w8.nbytes  # Q5_0: 6-bit codes as stored
    assert draft.model.layers[0].mlp.down_proj.weight.value.bits == 4  # Q4_K: as stored
    np.testing.assert_array_equal(draft.model.layers[0].mlp.down_proj.weight.value.dequantize(),
                                  target.model.layers[0].mlp.down_proj.weight.value.dequantize())
    assert not np.array_equal(w4.dequantize(), w8.dequantize())
    ids = [5, 17, 42, 8, 1, 30]
    ref = generate(target, ids, 24).tokens
    res = speculative_generate(target, draft, ids, 24, gamma=4)
    assert res.tokens == ref
    with pytest.raises(ModelLoadError, match="requantize"):
        load_model(str(gguf_pair), progress=False, weights="float32", cache_dir=tmp_path, requantize=4)


def test_concat_joins_weights_as_views_of_one() -> None:
    """PackedWeight.concat: the rows of each weight in turn (dequantized: the stacked weights), each weight's rows a
    view of the result; weights of another form, other inputs or a first weight not in whole tiles do not join."""
    from minitorch.cpu import packed as fast_packed
    from minitorch.tensor_data import MiniTorchError

    rng = np.random.default_rng(0)
    a, b, c = (PackedWeight.quantize(rng.standard_normal((n, 64)).astype(np.float32)) for n in (256, 128, 70))
    j = PackedWeight.concat([a, b, c])
    assert j.shape == (454, 64)
    np.testing.assert_array_equal(j.dequantize(), np.concatenate([a.dequantize(), b.dequantize(), c.dequantize()]))
    for w, start in ((a, 0), (b, 256), (c, 384)):
        part = j.narrow(0, start, w.shape[0])
        assert np.shares_memory(part.qt, j.qt)
        np.testing.assert_array_equal(part.dequantize(), w.dequantize())
    x = rng.standard_normal((3, 64)).astype(np.float32)
    out, sep = np.empty((3, 454), np.float32), np.empty((3, 128), np.float32)
    fast_packed.packed_linear(x, j, out)
    fast_packed.packed_linear(x, b, sep)
    assert np.array_equal(out[:, 256:384], sep)  # the joined product's columns are the separate product's bits
    q4 = PackedWeight.quantize4(rng.standard_normal((128, 256)).astype(np.float32))
    assert not a.joins(q4) and not c.joins(a) and not a.joins(PackedWeight.quantize(np.ones((128, 32), np.float32)))
    with pytest.raises(MiniTorchError, match="concat"):
        PackedWeight.concat([c, a])
