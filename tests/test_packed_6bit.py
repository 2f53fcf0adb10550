"""The 6-bit code form (minitorch/packed.py `bits` 6: per 16 inputs two nibble words of the low 4 bits of
code + 32 and one word of the high 2 bits; minitorch/cpu/packed.py's _tile_f32_q6 and _tile_i8_q6): the words
unpack to the codes, and every product equals the int8-code form's (the same weight with one byte a code) bit
for bit, in both activation modes, for every row count, with tails of tiles and of the kernel's input span, and
through a whole packed forward. The AVX2 paths are checked the same way in a subprocess (tests/test_packed_isa.py
forces them). A deliberately broken form or kernel fails the check."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import minitorch
from minitorch.cpu import packed as fast_packed
from minitorch.packed import TILE, PackedWeight, _six_codes, _six_words

gguf = pytest.importorskip("gguf")
from minitorch.models.gguf_packed import pack_raw  # noqa: E402
from test_models_packed import gguf_pair, random_blocks  # noqa: E402,F401

MODES = ("float32", "int8") if fast_packed.int8_supported() else ("float32",)
# (n, k, block, per, offsets): Q6_K's 16 x 16; Q5_K's 32 x 8 with offsets; a K of 3 groups of 16 (less than one
# span); 25 blocks of 32 (a span of 8 blocks, then a tail call of 1); 17 blocks of 16 under one factor; n past a tile
SHAPES = [(200, 512, 16, 16, False), (130, 256, 32, 8, True), (37, 48, 16, 1, False), (300, 800, 32, 1, True),
          (129, 272, 16, 17, False)]


def random_six(n: int, k: int, block: int, per: int, offsets: bool, seed: int) -> PackedWeight:
    """A 6-bit PackedWeight of random codes (-32..31, both ends present), int8 scales and float32 factors."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-32, 32, size=(n, k)).astype(np.int8)
    q[0, :2] = (-32, 31)
    sc = rng.integers(-128, 128, size=(n, k // block)).astype(np.int8)
    d = (rng.standard_normal((n, k // (block * per))) * 1e-3).astype(np.float32)
    m = rng.integers(-128, 128, size=sc.shape).astype(np.int8) if offsets else None
    dmin = (rng.standard_normal(d.shape) * 1e-3).astype(np.float32) if offsets else None
    pw = PackedWeight.from_blocks(q, block, per, sc, d, m, dmin)
    assert pw.bits == 6
    return pw


def assert_six_equals_int8_form(pw: PackedWeight, x: np.ndarray, mode: str, ref: PackedWeight = None) -> None:
    """The packed product of every leading row count of x (and of all of x) in activation mode `mode` is the
    same with the 6-bit weight as with its int8-code form (`ref`, default pw.recoded(8)), bit for bit."""
    ref = pw.recoded(8) if ref is None else ref
    assert ref.bits == 8
    n = pw.shape[0]
    old = fast_packed.set_activations(mode)
    try:
        for rows in sorted({*range(1, min(len(x), fast_packed.MAX_ROWS) + 1), len(x)}):
            a, b = np.empty((rows, n), np.float32), np.empty((rows, n), np.float32)
            fast_packed.packed_linear(x[:rows], pw, a)
            fast_packed.packed_linear(x[:rows], ref, b)
            assert np.array_equal(a, b), f"{mode}, {rows} rows: max diff {np.abs(a - b).max()}"
    finally:
        fast_packed.set_activations(old)


def test_six_words_unpack_to_the_codes() -> None:
    """_six_words -> _six_codes is the identity on -32..31, and the high word holds input 4c + t's 2 high bits at
    bits 8t + 2c (the place the kernels read them from)."""
    rng = np.random.default_rng(0)
    q = rng.integers(-32, 32, size=(7, 96)).astype(np.int8)
    w = _six_words(q)
    assert w.dtype == np.uint32 and w.shape == (7, 96 // 16 * 3)
    assert np.array_equal(_six_codes(w), q)
    u = q.astype(np.int64) + 32
    for s in range(96 // 16):
        high = w[:, 3 * s + 2].astype(np.int64)
        low = w[:, 3 * s:3 * s + 2].astype(np.int64)
        for i in range(16):
            t, c = i % 4, i // 4
            assert np.array_equal((high >> (8 * t + 2 * c)) & 3, u[:, 16 * s + i] >> 4)
            sh = 8 * (i % 4) + 4 * ((i % 8) // 4)
            assert np.array_equal((low[:, i // 8] >> sh) & 15, u[:, 16 * s + i] & 15)


@pytest.mark.parametrize("qtype", ["Q6_K", "Q5_K", "Q5_0", "Q5_1", "Q4_0"])
def test_gguf_types_pack_to_six_bits_and_back(qtype: str) -> None:
    """The GGUF types whose codes fit -32..31 pack to 6 bits; the tiles unpack to the int8 form's codes, and the
    weights are gguf's dequantized ones; Q6_K reads 0.75 + 1/16 + 4/256 bytes a weight (int8 codes: 1 + ...)."""
    n, k = TILE + 2, 512
    raw = random_blocks(qtype, n, k, seed=21)
    pw = pack_raw(qtype, raw, (n, k))
    p8 = pack_raw(qtype, raw, (n, k), bits=8)
    assert pw.bits == 6 and pw.qt.dtype == np.uint32 and p8.bits == 8
    assert np.array_equal(pw.codes(np.arange(n))[0], p8.codes(np.arange(n))[0])
    assert np.array_equal(pw.recoded(8).qt, p8.qt) and np.array_equal(p8.recoded(6).qt, pw.qt)
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]).reshape(n, k)
    assert np.array_equal(pw.dequantize(), want)
    if qtype == "Q6_K":
        assert pw.nbytes == 2 * TILE * k * (0.75 + 1 / 16 + 4 / 256)
        assert p8.nbytes == 2 * TILE * k * (1 + 1 / 16 + 4 / 256)


def test_six_bit_form_errors() -> None:
    q = np.zeros((4, 64), np.int8)
    ones, d = np.ones((4, 4), np.int8), np.ones((4, 4), np.float32)
    q[0, 0] = 32
    with pytest.raises(minitorch.MiniTorchError, match="6-bit packing needs codes in -32..31"):
        PackedWeight.from_blocks(q, 16, 1, ones, d, bits=6)
    assert PackedWeight.from_blocks(q, 16, 1, ones, d).bits == 8  # 32 does not fit: int8 codes
    q[0, 0] = -32
    with pytest.raises(minitorch.MiniTorchError, match="multiple of 16"):
        PackedWeight.from_blocks(q, 8, 1, np.ones((4, 8), np.int8), np.ones((4, 8), np.float32), bits=6)
    pw = PackedWeight.from_blocks(q, 16, 1, ones, d)
    with pytest.raises(minitorch.MiniTorchError, match="3 words to 16 inputs"):
        PackedWeight.from_tiles(pw.qt[:, :2], *pw.tiles[1:], pw.block, pw.per, pw.bits, 4)


@pytest.mark.parametrize("n, k, block, per, offsets", SHAPES)
@pytest.mark.parametrize("mode", MODES)
def test_six_bit_tiles_equal_the_int8_code_form(n: int, k: int, block: int, per: int, offsets: bool,
                                                mode: str) -> None:
    """Random codes and scales: every row count 1..16 and a prefill-sized call (40 rows: the float mode's
    BLAS path through rebuild_tiles, the int8 mode's chunks of 16) give the int8-code form's bits."""
    pw = random_six(n, k, block, per, offsets, seed=n + k)
    x = np.random.default_rng(k).standard_normal((40, k)).astype(np.float32)
    x[3, :block] = 0.0  # a zero activation block (xd 0 in the int8 mode)
    assert_six_equals_int8_form(pw, x, mode)


@pytest.mark.parametrize("mode", MODES)
def test_six_bit_one_hot_readout_is_the_weights(mode: str) -> None:
    """Unit activations read single weights out of the float kernel (float32 mode: its code -> float is exact
    at every one of the 64 codes); in the int8 mode a unit row quantizes to 127 * (1 / 127)."""
    from test_models_packed import one_hot_readout

    pw = random_six(TILE + 5, 64, 16, 4, True, seed=9)
    if mode == "float32":
        assert np.array_equal(one_hot_readout(pw), pw.dequantize())
    else:
        old = fast_packed.set_activations("int8")
        try:
            assert np.array_equal(one_hot_readout(pw), one_hot_readout(pw.recoded(8)))
        finally:
            fast_packed.set_activations(old)


@pytest.mark.parametrize("bug", ["high-bits-dropped", "offset-off-by-one", "nibble-words-swapped",
                                 "int8-correction-missing"])
def test_six_bit_check_catches_a_broken_form(bug: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The equality check above fails on broken 6-bit forms: the high-bit word left 0, codes stored as code + 31
    (the kernels still take 32 off), the two nibble words of each group swapped, and the int8 mode without its
    32 * sum(xq) correction (the activation sums it reads passed as 0)."""
    pw = random_six(200, 512, 16, 16, False, seed=1)
    ref = pw.recoded(8)
    x = np.random.default_rng(2).standard_normal((5, 512)).astype(np.float32)
    assert_six_equals_int8_form(pw, x, MODES[-1], ref)  # the real form passes
    g, nw, _ = pw.qt.shape
    words = pw.qt.reshape(g, nw // 3, 3, TILE)
    mode = "float32"
    if bug == "high-bits-dropped":
        broken = words.copy()
        broken[:, :, 2] = 0
    elif bug == "offset-off-by-one":
        q = pw.codes(np.arange(200))[0].astype(np.int16)
        q = np.where(q == -32, 31, q - 1).astype(np.int8)  # u = code + 31 stored (-32 wraps to 63): read as code - 1
        broken = PackedWeight.from_blocks(q, pw.block, pw.per, *pw._gather(np.arange(200))[1:3]).qt
    elif bug == "nibble-words-swapped":
        broken = words[:, :, [1, 0, 2]]
    else:
        if not fast_packed.int8_supported():
            pytest.skip("needs the int8 mode")
        mode = "int8"
        real = fast_packed.quantize_rows

        def no_sums(x, block):
            xq, xd, xs, xqs = real(x, block)
            return xq, xd, xs, np.zeros_like(xqs)

        monkeypatch.setattr(fast_packed, "quantize_rows", no_sums)
        broken = words
    bad = PackedWeight.from_tiles(np.ascontiguousarray(broken).reshape(pw.qt.shape), *pw.tiles[1:], pw.block,
                                  pw.per, pw.bits, 200)
    with pytest.raises(AssertionError):
        assert_six_equals_int8_form(bad, x, mode, ref)


@pytest.mark.parametrize("mode", MODES)
def test_packed_forward_with_six_bit_weights_equals_the_int8_code_form(gguf_pair: Path, tmp_path: Path,  # noqa: F811
                                                                       mode: str) -> None:
    """A whole packed model (its Q6_K and Q5_0 tensors 6-bit) gives the same logits, bit for bit, over a prefill,
    decode steps and a verify pass, as the same model with those weights in the int8-code form."""
    from minitorch.models import load_model

    six, _ = load_model(str(gguf_pair), progress=False, weights="packed", cache_dir=tmp_path)
    eight, _ = load_model(str(gguf_pair), progress=False, weights="packed", cache_dir=tmp_path)
    assert six.model.layers[1].self_attn.q_proj.weight.value.bits == 6  # Q6_K
    assert six.model.layers[1].mlp.up_proj.weight.value.bits == 6  # Q5_0
    recoded = 0
    for _, p in eight.named_parameters():
        if isinstance(p.value, PackedWeight) and p.value.bits == 6:
            p.update(p.value.recoded(8))
            recoded += 1
    eight.join_projections()
    assert recoded == 2 and eight.model.layers[1].self_attn.q_proj.weight.value.bits == 8
    ids = np.random.default_rng(3).integers(0, 400, size=19).tolist()
    old = fast_packed.set_activations(mode)
    try:
        logits = []
        for m in (six, eight):
            with minitorch.no_grad():
                cache = m.new_cache(40)
                out = [m(ids, cache).to_numpy()[0]]
                for t in (5, 9, 2):
                    out.append(m([t], cache).to_numpy()[0])
                out.append(m([7, 1, 8, 2, 8], cache).to_numpy()[0])
            logits.append(out)
    finally:
        fast_packed.set_activations(old)
    for a, b in zip(*logits):
        assert np.array_equal(a, b)
