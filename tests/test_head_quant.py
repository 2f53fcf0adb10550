"""A draft head's compressed files (minitorch/models/head_io.py: int8 a row, int4 in groups of 32, float16 scales).

- the codes against independent references: torch's round and clamp for int8, and for int4 a per-element loop
  that writes each byte as even code + 16 * odd code (two's complement nibbles);
- a head saved as int8 / int4 loads as those codes times their scales, in a file of about a quarter / an eighth of
  float32's, and still drafts exactly (greedy speculative decoding with it equals the target alone);
- a loader that reads the nibbles in the wrong order is caught by the same check.
"""
from __future__ import annotations

import numpy as np
import pytest

from minitorch.generation import SamplingConfig, generate, speculative_generate
from minitorch.generation.head_drafter import HeadDrafter
from minitorch.models import load_model
from minitorch.models import head_io
from minitorch.models.draft_head import DraftHead, DraftHeadConfig
from minitorch.models.head_io import GROUP, dequantize, load_head, quantize, save_head

torch = pytest.importorskip("torch")
from test_models_util import hf_qwen2, save_hf, tiny_bpe  # noqa: E402


def _weights(seed: int, rows: int = 24, cols: int = 96) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32) * 0.05
    w[3, 5] = 0.9  # an outlier sets its row's (int8) or group's (int4) scale
    w[7] = 0.0  # an all-zero row: scale 0, codes 0
    return w


def test_int8_codes_equal_torch_rounding():
    w = _weights(0)
    codes, scale = quantize(w, "int8")
    assert codes.dtype == np.int8 and scale.dtype == np.float16 and scale.shape == (w.shape[0], 1)
    s = scale.astype(np.float32)[:, 0]
    ts = torch.tensor(np.where(s > 0, s, 1.0))[:, None]
    ref = torch.clamp(torch.round(torch.tensor(w) / ts), -127, 127).to(torch.int8).numpy()  # round half to even
    np.testing.assert_array_equal(codes, ref)
    np.testing.assert_allclose(s, np.abs(w).max(axis=1) / 127, rtol=1e-3)  # float16's rounding of amax / 127
    back = dequantize(codes, scale, "int8")
    assert np.all(np.abs(back - w) <= s[:, None] / 2 + 1e-7)


def _int4_reference(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int4 codes and scales, one element at a time: each group's scale is float16(max |w| / 7), each code the nearest
    integer of w / scale in -7..7, each byte (even column's code mod 16) + 16 * (odd column's code mod 16)."""
    rows, cols = w.shape
    scale = np.zeros((rows, cols // GROUP), np.float16)
    out = np.zeros((rows, cols // 2), np.uint8)
    for r in range(rows):
        for g in range(cols // GROUP):
            scale[r, g] = np.float16(max(abs(float(v)) for v in w[r, g * GROUP:(g + 1) * GROUP]) / 7)
        for c in range(0, cols, 2):
            s = float(scale[r, c // GROUP])
            q = [0 if s == 0 else int(min(7, max(-7, round(float(w[r, c + k]) / s)))) for k in (0, 1)]
            out[r, c // 2] = (q[0] % 16) + 16 * (q[1] % 16)
    return out, scale


def test_int4_codes_equal_a_per_element_reference():
    w = _weights(1)
    codes, scale = quantize(w, "int4")
    ref_codes, ref_scale = _int4_reference(w)
    np.testing.assert_array_equal(scale, ref_scale)
    np.testing.assert_array_equal(codes, ref_codes)
    back = dequantize(codes, scale, "int4")
    s = np.repeat(scale.astype(np.float32), GROUP, axis=1)
    assert np.all(np.abs(back - w) <= s / 2 + 1e-7)
    assert np.abs(back - w).max() > 0  # it is lossy: the check above is not vacuous


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    root = tmp_path_factory.mktemp("quant_target")
    save_hf(hf_qwen2(seed=0, max_position_embeddings=1024), root / "t", tiny_bpe())
    model, _ = load_model(root / "t", progress=False)
    return model


def _head(model) -> DraftHead:
    cfg = DraftHeadConfig.for_target(model, head_vocab=300, intermediate_size=64)
    return DraftHead(cfg, model.backend, seed=5)


def _loaded_equals_codes(head: DraftHead, back: DraftHead, dtype: str) -> None:
    """Every 2-D weight of the loaded head is quantize's codes times scales (an independent dequantization), every
    vector the float16 of the original."""
    for (name, p), (_, q) in zip(head.named_parameters(), back.named_parameters()):
        w, got = np.asarray(p.value.to_numpy()), np.asarray(q.value.to_numpy())
        if w.ndim == 2:
            if dtype == "int8":
                codes, scale = quantize(w, dtype)
                want = codes.astype(np.float32) * scale.astype(np.float32)
            else:
                ref_codes, ref_scale = _int4_reference(w)
                lo = (ref_codes % 16).astype(np.int16)
                hi = (ref_codes // 16).astype(np.int16)
                q4 = np.zeros(w.shape, np.int16)
                q4[:, 0::2], q4[:, 1::2] = np.where(lo > 7, lo - 16, lo), np.where(hi > 7, hi - 16, hi)
                want = q4 * np.repeat(ref_scale.astype(np.float32), GROUP, axis=1)
        else:
            want = w.astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("dtype,most", [("int8", 0.30), ("int4", 0.17)])
def test_compressed_head_loads_as_its_codes_and_still_drafts_exactly(target, tmp_path, dtype, most):
    head = _head(target)
    save_head(head, tmp_path / "f32")
    save_head(head, tmp_path / dtype, dtype)
    size = (tmp_path / dtype / "head.safetensors").stat().st_size
    full = (tmp_path / "f32" / "head.safetensors").stat().st_size
    assert size < most * full, (size, full)
    back = load_head(tmp_path / dtype, target)
    _loaded_equals_codes(head, back, dtype)
    prompt, cfg = [5, 9, 12, 3, 7], SamplingConfig(temperature=0.0)
    spec = speculative_generate(target, HeadDrafter(back, target), prompt, 30, cfg, gamma=3)
    assert spec.tokens == generate(target, prompt, 30, cfg).tokens


def test_a_loader_reading_the_nibbles_swapped_is_caught(target, tmp_path, monkeypatch):
    head = _head(target)
    save_head(head, tmp_path / "q", "int4")

    def swapped(codes, scale, dtype):
        return dequantize(((codes >> 4) | (codes << 4)).astype(np.uint8), scale, dtype)

    monkeypatch.setattr(head_io, "dequantize", swapped)
    with pytest.raises(AssertionError):
        _loaded_equals_codes(head, load_head(tmp_path / "q", target), "int4")


def test_the_shipped_heads_are_whole_and_small():
    """Every folder of heads/ (the drafters a fresh clone drafts with: --drafter auto) holds the files its SHA256SUMS
    lists, byte for byte, a head.safetensors of at most 25 MB stored compressed, and a head.json naming its target's
    fingerprint and how it was trained. A clone missing the weights (an ignore rule) fails here."""
    import hashlib
    import json
    from pathlib import Path

    from minitorch.models.head_io import _stored_dtype

    heads = Path(__file__).resolve().parents[1] / "heads"
    folders = sorted(p.parent for p in heads.glob("*/SHA256SUMS"))
    assert folders, "no shipped head"
    for folder in folders:
        sums = [line.split() for line in (folder / "SHA256SUMS").read_text().splitlines() if line.strip()]
        assert {name for _, name in sums} >= {"head.safetensors", "head.json"}
        for digest, name in sums:
            assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, folder / name
        assert (folder / "head.safetensors").stat().st_size <= 25_000_000
        assert _stored_dtype(folder / "head.safetensors") in ("int4", "int8")
        cfg = json.loads((folder / "head.json").read_text())
        assert len(cfg["target_fingerprint"]) == 16 and cfg["training"]["steps"] > 0
