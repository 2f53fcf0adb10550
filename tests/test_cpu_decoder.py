"""The CPU's one-call forward (minitorch/cpu/decoder.py, FastBackend's decoder_forward slot) against the model's
op-by-op path (model.fused = False, the reference): the same bits for every output the model returns (prefill
through the BLAS path and the kernel path, decode steps, a verify pass, last_n, head_rows, return_hidden), the
same KV cache, in float32 and int8 activations; it is taken only where it applies; a slip in it is caught."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import minitorch
from minitorch import FastBackend
from minitorch.cpu import decoder as fd
from minitorch.cpu import packed as fast_packed
from minitorch.models import load_model
from test_models_util import count_calls

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny qwen2 GGUF, 256-wide rows, Q8_0 weights with one Q4_K tensor (nibble words) and an untied head."""
    pytest.importorskip("torch")
    from gguf import GGMLQuantizationType

    from test_models_packed import random_blocks
    from test_models_util import hf_qwen2, tiny_bpe, write_gguf

    hf = hf_qwen2(seed=7, hidden_size=256, num_attention_heads=4, num_key_value_heads=2, intermediate_size=512,
                  num_hidden_layers=2, tie_word_embeddings=False)
    blocks = random_blocks("Q4_K", 256, 512, 4).reshape(-1, 144)
    blocks[:, 0:4] = (blocks[:, 0:4].copy().view(np.float16) * np.float16(0.01)).view(np.uint8)  # small, like trained
    raw = {"blk.1.ffn_down.weight": (blocks.reshape(256, -1), GGMLQuantizationType.Q4_K)}
    return write_gguf(tmp_path_factory.mktemp("fused") / "tiny.gguf", hf, tiny_bpe(), qtype="Q8_0", raw_override=raw)


@pytest.fixture(scope="module")
def model(gguf_model: Path, tmp_path_factory: pytest.TempPathFactory):
    m, _ = load_model(str(gguf_model), progress=False, weights="packed", cache_dir=tmp_path_factory.mktemp("c"))
    return m


def _session(model, fused: bool, prompt: list[int]) -> dict[str, np.ndarray]:
    """Every kind of call the engines make, from one cache; all outputs (copied) and the cache at the end."""
    model.fused = fused
    out = {}
    with minitorch.no_grad():
        cache = model.new_cache(96)
        logits, hidden = model(prompt, cache, return_hidden=True)
        out["prefill"], out["prefill_hidden"] = logits.to_numpy().copy(), hidden.to_numpy().copy()
        toks = [int(out["prefill"][0, -1].argmax())]
        for i in range(4):  # decode steps
            step = model([toks[-1]], cache).to_numpy()[0, -1].copy()
            out[f"step{i}"] = step
            toks.append(int(step.argmax()))
        cache.truncate(cache.length - 3)
        out["verify"] = model(toks[1:4] + [7, 11], cache).to_numpy().copy()  # 5 rows
        out["last_n"] = model([3, 5, 9], cache, last_n=2).to_numpy().copy()
        out["head_rows"] = model([toks[0]], cache, head_rows=128).to_numpy().copy()
        lg, hd = model([4, 6], cache, last_n=1, return_hidden=True)
        out["hidden_last"], out["hidden"] = lg.to_numpy().copy(), hd.to_numpy().copy()
        n = cache.length
        out["keys"] = np.stack([k.to_numpy()[0, :, :n] for k in cache.keys])
        out["values"] = np.stack([v.to_numpy()[0, :, :n] for v in cache.values])
    model.fused = True
    return out


def _assert_same(ref: dict, got: dict) -> None:
    assert ref.keys() == got.keys()
    for name in ref:
        assert ref[name].shape == got[name].shape, name
        assert np.array_equal(ref[name], got[name]), f"{name}: max diff {np.abs(ref[name] - got[name]).max()}"


# 9 tokens: every product through the packed kernel; 40 tokens: more than MAX_ROWS rows, the rebuild + BLAS path
@pytest.mark.parametrize("n_prompt", [9, 40])
@pytest.mark.parametrize("threaded_attention", [False, True])  # True: every attention call takes the threaded kernel
def test_one_call_forward_equals_the_op_by_op_model_bit_for_bit(model, n_prompt: int, threaded_attention: bool,
                                                               monkeypatch) -> None:
    from minitorch.cpu import ops as cpu_ops

    if threaded_attention:
        monkeypatch.setattr(cpu_ops, "PARALLEL_ATTENTION_WORK", 0)
    calls = count_calls(monkeypatch, FastBackend, "decoder_forward")
    prompt = np.random.default_rng(n_prompt).integers(0, 400, size=n_prompt).tolist()
    ref = _session(model, False, prompt)
    assert calls["n"] == 0
    got = _session(model, True, prompt)
    assert calls["n"] == 9  # every call of the session took the one-call forward
    _assert_same(ref, got)


@pytest.mark.skipif(not fast_packed.int8_supported(), reason="needs AVX2 or AVX512-VNNI")
def test_one_call_forward_equals_the_op_by_op_model_with_int8_activations(model) -> None:
    old = fast_packed.set_activations("int8")
    try:
        prompt = np.random.default_rng(1).integers(0, 400, size=21).tolist()
        ref, got = _session(model, False, prompt), _session(model, True, prompt)
    finally:
        fast_packed.set_activations(old)
    _assert_same(ref, got)
    fp32 = _session(model, True, prompt)
    assert not np.array_equal(fp32["step0"], got["step0"])  # the int8 mode was in force


def test_a_slip_in_the_one_call_forward_is_caught(model, monkeypatch) -> None:
    """The comparison above fails on a broken fused path: rotary embeddings with the sine's sign flipped."""
    prompt = np.random.default_rng(2).integers(0, 400, size=9).tolist()
    ref = _session(model, False, prompt)
    real = fd._rope
    monkeypatch.setattr(fd, "_rope", lambda x, cos, sin: real(x, cos, -sin))
    got = _session(model, True, prompt)
    with pytest.raises(AssertionError):
        _assert_same(ref, got)


def test_the_op_by_op_path_runs_where_the_one_call_forward_does_not_apply(gguf_model: Path, model, tmp_path: Path,
                                                                          monkeypatch) -> None:
    def refuse(*a, **k):
        raise AssertionError("decoder_forward called")

    monkeypatch.setattr(FastBackend, "decoder_forward", refuse)
    with pytest.raises(AssertionError, match="decoder_forward called"), minitorch.no_grad():
        model([1, 2, 3], model.new_cache(8))
    dense, _ = load_model(str(gguf_model), progress=False, weights="float32", cache_dir=tmp_path)
    with minitorch.no_grad():
        dense([1, 2, 3], dense.new_cache(8))  # float32 weights: op by op
    model([1, 2, 3], model.new_cache(8))  # a gradient being recorded: op by op


@pytest.mark.skipif(not fast_packed.int8_supported(), reason="needs AVX2 or AVX512-VNNI")
def test_a_models_own_activation_mode_leaves_other_models_and_the_process_alone(gguf_model: Path, model,
                                                                                tmp_path: Path) -> None:
    """set_weight_activations on one model's packed weights: that model computes exactly as under the process-wide
    int8 mode, a second model of the same file keeps the process's float32 bits, the process's mode is unchanged,
    a narrowed weight (a draft head's rows of the LM head) keeps its weight's mode, and None puts it back."""
    prompt = np.random.default_rng(4).integers(0, 400, size=9).tolist()
    old = fast_packed.set_activations("int8")
    try:
        ref_int8 = _session(model, True, prompt)
    finally:
        fast_packed.set_activations(old)
    ref_fp32 = _session(model, True, prompt)
    other, _ = load_model(str(gguf_model), progress=False, weights="packed", cache_dir=tmp_path)
    fast_packed.set_weight_activations(model.packed_weights(), "int8")
    try:
        # 7 projections a layer and its 2 joined weights (q/k/v, gate/up), the embedding and the LM head
        assert len(model.packed_weights()) == 2 * (7 + 2) + 2
        assert fast_packed.get_activations() == "float32"
        _assert_same(ref_int8, _session(model, True, prompt))
        _assert_same(ref_fp32, _session(other, True, prompt))
        assert model.lm_head_weight().narrow(0, 0, 128).activations == "int8"
    finally:
        fast_packed.set_weight_activations(model.packed_weights(), None)
    _assert_same(ref_fp32, _session(model, True, prompt))
    with pytest.raises(ValueError, match="float32, int8"):
        fast_packed.set_weight_activations(model.packed_weights(), "int4")


def _unjoin(model) -> list:
    """Every layer's joined weights taken away (the forward then runs each projection alone); returns them."""
    saved = []
    for i in range(len(model.model.layers)):
        for m in (model.model.layers[i].self_attn, model.model.layers[i].mlp):
            saved.append((m, m.joined))
            m.joined = None
    return saved


def test_joined_projections_give_the_separate_products_bits_in_fewer_calls(model, monkeypatch) -> None:
    """load_weights joined each layer's q/k/v (all Q8_0) and gate/up into one weight each: a decode step makes
    4 product calls a layer and 1 for the LM head instead of 7 and 1, and every output of a session is the same bits
    as with the joins taken away (each projection's own product); a join with its columns split wrongly is caught."""
    layer = model.model.layers[0]
    assert layer.self_attn.joined[1] == 3 and layer.mlp.joined[1] == 2
    q = layer.self_attn.q_proj.weight.value
    assert np.shares_memory(q.qt, layer.self_attn.joined[0].qt)  # a view, not a second copy
    prompt = np.random.default_rng(5).integers(0, 400, size=12).tolist()
    calls = count_calls(monkeypatch, fast_packed, "packed_linear")
    joined = _session(model, True, prompt)
    with minitorch.no_grad():
        cache = model.new_cache(16)
        model([1, 2], cache)
        calls["n"] = 0
        model([3], cache)
    assert calls["n"] == 2 * 4 + 1
    saved = _unjoin(model)
    try:
        separate = _session(model, True, prompt)
    finally:
        for m, j in saved:
            m.joined = j
    _assert_same(separate, joined)
    real_linears = fd._linears

    def misplit(x, ws, bs, j):
        outs = real_linears(x, ws, bs, j)
        if j is not None:
            outs[1] = outs[1][:, ::-1]  # the joined product's second projection with its columns in the wrong order
        return outs

    monkeypatch.setattr(fd, "_linears", misplit)
    with pytest.raises(AssertionError):
        _assert_same(separate, _session(model, True, prompt))


def test_a_weight_set_after_the_join_undoes_it_for_its_layer(gguf_model: Path, tmp_path: Path) -> None:
    """Setting a projection's weight anew (here a copy with its values doubled) leaves the joined weight stale: the
    layer then computes each projection alone, with the new weight, as the op-by-op path does."""
    from minitorch.packed import PackedWeight

    m, _ = load_model(str(gguf_model), progress=False, weights="packed", cache_dir=tmp_path)
    lin = m.model.layers[1].self_attn.k_proj
    w = lin.weight.value
    lin.weight.update(PackedWeight.from_tiles(w.qt.copy(), w.sc.copy(), w.d * np.float32(2), w.m.copy(), w.dmin.copy(),
                                              w.block, w.per, w.bits, w.shape[0]))
    with minitorch.no_grad():
        layers = m._fused(None).layers
    assert layers[1].qkv is None and layers[0].qkv is not None and layers[1].gate_up is not None
    prompt = np.random.default_rng(6).integers(0, 400, size=9).tolist()
    _assert_same(_session(m, False, prompt), _session(m, True, prompt))
