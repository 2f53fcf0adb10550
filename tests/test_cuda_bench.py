"""project/bench/throughput.py's model loading for --model (registry names, GGUF files, HF folders):
float32 checkpoint-named arrays as the CUDA decoder uploads them, never the CPU's packed form.
Runs on the CPU (no GPU needed); the cost model's arithmetic against Leviathan's formula."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from project.bench import throughput as bt
from minitorch.generation.stats import expected_tokens_per_round
from test_models_util import hf_qwen2, save_hf, tiny_bpe, write_gguf


def reference_arrays(path: Path) -> dict:
    from minitorch.models import load_model

    model, _ = load_model(path, dtype="float32", weights="float32")
    return {n: np.asarray(p.value.to_numpy(), np.float32) for n, p in model.named_parameters()}


@pytest.mark.parametrize("tied", [True, False])
def test_load_real_gguf_gives_float32_weights(tmp_path: Path, tied: bool, monkeypatch) -> None:
    monkeypatch.setenv("MINITORCH_SPEC_CACHE", str(tmp_path / "cache"))
    m = hf_qwen2(tie_word_embeddings=tied)
    path = write_gguf(tmp_path / "m.gguf", m, tiny_bpe(), qtype="Q8_0")  # packable: the CPU default is packed
    shape, weights, vocab = bt.load_real(str(path))
    assert shape["tie_word_embeddings"] is tied
    assert shape["vocab_size"] == m.config.vocab_size and shape["hidden_size"] == m.config.hidden_size
    assert vocab == min(m.config.vocab_size, tiny_bpe().get_vocab_size())
    ref = reference_arrays(path)
    assert set(weights) == set(ref) and ("lm_head.weight" in weights) is not tied
    for name, arr in weights.items():
        assert isinstance(arr, np.ndarray) and arr.dtype == np.float32
        np.testing.assert_array_equal(arr, ref[name])


def test_load_real_hf_folder(tmp_path: Path) -> None:
    m = hf_qwen2(tie_word_embeddings=False)
    folder = save_hf(m, tmp_path / "hf", tiny_bpe())
    shape, weights, _ = bt.load_real(str(folder))
    sd = m.state_dict()
    assert shape["num_hidden_layers"] == m.config.num_hidden_layers
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.layers.0.mlp.down_proj.weight"):
        np.testing.assert_allclose(weights[name], sd[name].detach().numpy(), rtol=0, atol=0)


def test_load_real_check_catches_packed_weights(tmp_path: Path, monkeypatch) -> None:
    """The GGUF test above fails on the old loader (load_model's default weights='auto' -> packed
    tensors on the CPU backend, which have no to_numpy)."""
    monkeypatch.setenv("MINITORCH_SPEC_CACHE", str(tmp_path / "cache"))
    import minitorch.models as models

    real = models.load_model
    monkeypatch.setattr(models, "load_model", lambda name, dtype="float32", weights="auto", **kw: real(name, dtype=dtype, **kw))
    path = write_gguf(tmp_path / "m.gguf", hf_qwen2(tie_word_embeddings=True), tiny_bpe(), qtype="Q8_0")
    with pytest.raises(AttributeError):
        bt.load_real(str(path))


def test_bench_model_user_errors(tmp_path: Path, capsys, monkeypatch) -> None:
    """A missing model file or a bad flag: one line and exit status 2 (checked before any GPU work)."""
    import minitorch.cuda.runtime as rt

    monkeypatch.setattr(rt, "cuda_available", lambda: True)  # so the model is looked for, not the GPU
    monkeypatch.setattr(rt, "get_cupy", lambda: pytest.fail("no GPU work before the model is found"))
    assert bt.main(["--model", str(tmp_path / "missing.gguf")]) == 2
    assert bt.main(["--attn-kb", "40"]) == 2
    assert bt.main(["--spec", "--gammas", "9"]) == 2
    assert bt.main(["--spec", "--model", "x"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and all(line.startswith("bench_throughput: ") for line in err)
    assert "missing.gguf" in err[0] and "--attn-kb" in err[1] and "--gammas" in err[2]


def test_cost_model_is_leviathans_formula_with_the_measured_verify() -> None:
    got = bt.cost_model(0.85, 0.3, {g: 1.0 + 0.05 * g for g in range(1, 9)}, [2, 4, 4])
    assert list(got) == [2, 4]
    for g in (2, 4):
        assert got[g] == pytest.approx(expected_tokens_per_round(0.85, g) / (g * 0.3 + 1.0 + 0.05 * g))
        assert bt.expected_tokens_per_round(0.85, g) == pytest.approx(expected_tokens_per_round(0.85, g))


def test_cost_model_with_looked_up_drafts() -> None:
    """--extend: gamma model drafts at alpha, then looked-up ones at their own rates, no draft step for them,
    the verify of gamma + extend drafts; with extend 0 it is cost_model."""
    vr = {g: 1.0 + 0.05 * g for g in range(1, 9)}
    got = bt.cost_model_extended(0.85, 0.25, vr, [3, 5], 4, lookup_rates=(0.5, 0.7))
    assert list(got) == [3]  # 5 + 4 drafts: no verify measured
    rates = [0.85] * 3 + [0.5, 0.7, 0.7, 0.7]
    E, run = 1.0, 1.0
    for a in rates:
        run *= a
        E += run
    assert got[3] == pytest.approx(E / (3 * 0.25 + vr[7]))
    assert bt.cost_model_extended(0.85, 0.25, vr, [2, 4], 0) == pytest.approx(bt.cost_model(0.85, 0.25, vr, [2, 4]))
    # round 10's R1 step costs (call 36: 7B 4.457 ms, verify(7) 1.16x; 1.5B draft 1.051 ms)
    r1 = bt.cost_model_extended(0.85, 1.051 / 4.457, {3: 1.07, 4: 1.09, 7: 1.16}, [3, 4], 4)
    assert r1[3] > bt.cost_model(0.85, 1.051 / 4.457, {3: 1.07, 4: 1.09, 7: 1.16}, [4])[4]
