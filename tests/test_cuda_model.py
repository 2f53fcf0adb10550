"""Qwen2 on the GPU: the unchanged model on the CUDA backend against the CPU backend (float32 and
bf16), the graph-captured CudaDecoder against the CPU model, graph replay against eager steps, and
greedy speculative decoding on the GPU against greedy autoregressive decoding. GPU only."""
from __future__ import annotations

import numpy as np
import pytest

import minitorch
from minitorch import FastBackend
from cuda_helpers import needs_gpu, round_bf16

pytestmark = [pytest.mark.gpu, needs_gpu]

CONFIGS = [
    dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
         num_key_value_heads=2, tie_word_embeddings=True, rope_theta=10000.0),
    dict(vocab_size=203, hidden_size=96, intermediate_size=80, num_hidden_layers=3, num_attention_heads=6,
         num_key_value_heads=1, tie_word_embeddings=False, rope_theta=1e6),
    dict(vocab_size=130, hidden_size=256, intermediate_size=352, num_hidden_layers=2, num_attention_heads=2,
         num_key_value_heads=2, tie_word_embeddings=False, rope_theta=10000.0),  # head_dim 128
]


def build(cfg_kw, backend, dtype="float32", seed=0):
    from minitorch.models import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**cfg_kw)
    m = Qwen2ForCausalLM(cfg, backend=backend, dtype=dtype)
    r = np.random.default_rng(seed)
    w = {}
    for name, _ in m.named_parameters():
        shape = m.expected_shape(name)
        w[name] = (1 + 0.1 * r.standard_normal(shape) if "norm" in name else 0.15 * r.standard_normal(shape)).astype(np.float32)
    m.load_weights(w)
    return m, w


def logits_steps(model, prompt, steps):
    """Prompt logits then one decode step per token of `steps`, as float64 numpy (T, V) blocks."""
    out = []
    with minitorch.no_grad():
        cache = model.new_cache(64)
        out.append(np.asarray(model(prompt, cache).to("float32").to_numpy(), np.float64)[0])
        for t in steps:
            out.append(np.asarray(model([t], cache).to("float32").to_numpy(), np.float64)[0])
        cache.truncate(len(prompt))  # rollback + a 3-token verify step
        out.append(np.asarray(model(steps[:3], cache).to("float32").to_numpy(), np.float64)[0])
    return out


@pytest.mark.parametrize("cfg_kw", CONFIGS, ids=["tied-gqa2", "untied-gqa6", "hd128"])
def test_model_logits_gpu_vs_cpu_float32(cfg_kw):
    from minitorch.cuda.ops import make_cuda_backend

    cpu, _ = build(cfg_kw, FastBackend)
    gpu, _ = build(cfg_kw, make_cuda_backend())
    prompt, steps = [1, 5, 9, 2, 7, 3, 11], [4, 8, 15, 16]
    for a, b in zip(logits_steps(cpu, prompt, steps), logits_steps(gpu, prompt, steps)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)


def test_model_logits_gpu_bf16_vs_cpu():
    from minitorch.cuda.ops import make_cuda_backend

    cpu, _ = build(CONFIGS[0], FastBackend)
    gpu, _ = build(CONFIGS[0], make_cuda_backend(), dtype="bfloat16")
    prompt, steps = [1, 5, 9, 2, 7, 3, 11], [4, 8, 15, 16]
    for a, b in zip(logits_steps(cpu, prompt, steps), logits_steps(gpu, prompt, steps)):
        # bf16 weights and activations: error relative to the logit scale
        assert np.abs(b - a).max() <= 0.05 * np.abs(a).max() + 0.05


def decoder_of(cfg_kw, w, max_len=96, max_tokens=16, qkv_epilogue=False, **kw):
    """A CudaDecoder of the test config. qkv_epilogue: the QKV GEMV reads the norm the down projection's epilogue
    wrote, as it does for hidden sizes > 2048 (the test models are small: their QKV GEMV normalises its input)."""
    from minitorch.cuda.decoder import CudaDecoder
    from minitorch.models import Qwen2Config

    kw.setdefault("graph_prefill", False)  # eager prefill unless a test asks: the paths these tests compare
    dec = CudaDecoder(Qwen2Config(**cfg_kw), w, max_len=max_len, max_tokens=max_tokens, **kw)
    if qkv_epilogue:
        dec.qkv_norm_in_gemv = False
    return dec


MODES = [dict(gemv="ours1"), dict(gemv="ours"), dict(gemv="ours1", qkv_epilogue=True),
         dict(gemv="ours", qkv_epilogue=True), dict(gemv="tc"), dict(gemv="ourstc")]
# the test models are small (hidden <= 256): their QKV GEMV normalises its own input (qkvepi: as for larger ones)
MODE_IDS = ["ours1", "ours", "ours1-qkvepi", "ours-qkvepi", "tc", "ourstc"]


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("i", range(len(CONFIGS)))
def test_cuda_decoder_matches_cpu_model(i, mode):
    cfg_kw = CONFIGS[i]
    cpu, w = build(cfg_kw, FastBackend)
    wb = {k: round_bf16(v) for k, v in w.items()}
    cpu.load_weights(wb)
    dec = decoder_of(cfg_kw, w, **mode)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    with minitorch.no_grad():
        cache = cpu.new_cache(64)
        ref = np.asarray(cpu(prompt, cache).to_numpy(), np.float64)[0]
    dec.set_position(0)
    dec.run(prompt, all_logits=True, advance=True)
    dec.stream.synchronize()
    got = dec.logits[:len(prompt)].get().astype(np.float64)
    assert np.abs(got - ref).max() <= 0.05 * np.abs(ref).max() + 0.05
    # the next decode step through the captured graph equals the eager step
    nxt = int(dec.tokens[:1].get()[0])
    assert nxt == int(np.argmax(got[-1]))
    dec.replay(1, all_logits=False, advance=False)
    dec.stream.synchronize()
    g_logits = dec.logits[:1].get().copy()
    dec.run([nxt], all_logits=False, advance=False, graph=False)
    dec.stream.synchronize()
    np.testing.assert_array_equal(dec.logits[:1].get(), g_logits)
    with minitorch.no_grad():
        ref2 = np.asarray(cpu([nxt], cache).to_numpy(), np.float64)[0, 0]
    assert np.abs(g_logits[0] - ref2).max() <= 0.05 * np.abs(ref2).max() + 0.05


@pytest.mark.parametrize("i", range(len(CONFIGS)))
def test_ourstc_steps_are_ours_for_one_token_and_tc_for_more(i):
    """gemv="ourstc" (a draft's): from the same cache, a one-token step gives the bits of gemv="ours" and a
    two-token step those of gemv="tc" (logits and the KV entries it appends)."""
    _, w = build(CONFIGS[i], FastBackend, seed=6)
    prompt = [(7 * j + 3) % 100 for j in range(20)]  # 20 > 16 tokens: cuBLAS in every mode, the same cache
    decs = {g: decoder_of(CONFIGS[i], w, max_tokens=32, gemv=g) for g in ("ourstc", "ours", "tc")}

    def step(dec, ids):
        dec.set_position(0)
        dec.run(prompt, all_logits=False, advance=False)
        dec.set_position(len(prompt))
        dec.run(ids, all_logits=True, advance=False)
        dec.stream.synchronize()
        n, lw = len(prompt), dec.layers[-1]
        return dec.logits[:len(ids)].get(), lw["k"][:, n:n + len(ids)].get(), lw["v"][:, n:n + len(ids)].get()

    for ids, ref in (([11], "ours"), ([11, 12], "tc")):
        got, want = step(decs["ourstc"], ids), step(decs[ref], ids)
        for g, r in zip(got, want):
            np.testing.assert_array_equal(g, r)
    other = step(decs["ours"], [11, 12])[0]
    assert not np.array_equal(step(decs["ourstc"], [11, 12])[0], other)  # the two GEMVs' bits do differ


EXACT_KW = {"ours": {}, "qkvepi": dict(qkv_epilogue=True), "tc": dict(gemv="tc")}


# long rows (intermediate_size > 8192: the down projection's K runs over many chunks a thread)
LONG_K = dict(vocab_size=97, hidden_size=64, intermediate_size=8200, num_hidden_layers=1, num_attention_heads=4,
              num_key_value_heads=2, tie_word_embeddings=True, rope_theta=10000.0)
EXACT_CONFIGS = CONFIGS + [LONG_K]


@pytest.mark.parametrize("variant", list(EXACT_KW))
@pytest.mark.parametrize("i", range(len(EXACT_CONFIGS)))
def test_exact_mode_verify_step_equals_decode_steps_bitwise(i, variant):
    """gemv="ours": a verify step over 5 tokens gives each token exactly the logits (and KV entries)
    that 5 one-token decode steps give; this is what makes speculative == autoregressive."""
    _, w = build(EXACT_CONFIGS[i], FastBackend, seed=3)
    dec = decoder_of(EXACT_CONFIGS[i], w, **{"gemv": "ours", **EXACT_KW[variant]})
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    first = dec.prefill(prompt)
    toks = [first, 7, 3, 9, 12] + ([4, 8, 15, 16, 23, 42, 2, 11] if variant.startswith("tc") else [])  # 13: gemvtc16
    p = len(prompt)
    steps = []
    for j, t in enumerate(toks):
        dec.set_position(p + j)
        dec.run([t], all_logits=True, advance=False)
        dec.stream.synchronize()
        steps.append(dec.logits[:1].get().copy())
    n = len(toks)
    kv = [lw["k"][:, :p + n].get().copy() for lw in dec.layers]
    for m in sorted({5, n}):  # a 5-token verify (and, for tc, a 13-token one: gemvtc16)
        dec.set_position(p)
        dec.run(toks[:m], all_logits=True, advance=False)
        dec.stream.synchronize()
        np.testing.assert_array_equal(dec.logits[:m].get(), np.concatenate(steps[:m]))
        for lw, k in zip(dec.layers, kv):
            np.testing.assert_array_equal(lw["k"][:, :p + m].get(), k[:, :p + m])


# "ours" modes are exact by construction (test above); "ours1" verifies with cuBLAS, whose summation
# order differs from our GEMV's: equality then holds only while no near-tie between the top two
# logits occurs (true for these weights and seeds, not guaranteed in general)
SPEC_MODES = [dict(gemv="ours"), dict(gemv="ours1"), dict(gemv="ours", qkv_epilogue=True), dict(gemv="tc")]


@pytest.mark.parametrize("mode", SPEC_MODES, ids=["ours-exact", "ours1-cublas-verify", "ours-exact-qkvepi",
                                                  "tc-exact"])
@pytest.mark.parametrize("gamma", [1, 4, 7])
def test_greedy_speculative_equals_greedy_on_gpu(gamma, mode):
    from minitorch.generation.cuda import generate_cuda, speculative_generate_cuda

    _, wt = build(CONFIGS[0], FastBackend, seed=1)
    draft_kw = dict(CONFIGS[0], hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                    num_hidden_layers=1)
    _, wd = build(draft_kw, FastBackend, seed=2)
    target = decoder_of(CONFIGS[0], wt, **mode)
    prompt = [5, 17, 42, 8, 1, 30]
    ar = generate_cuda(target, prompt, 40).tokens
    same = decoder_of(CONFIGS[0], wt, **mode)  # the target as its own draft: every token accepted
    res = speculative_generate_cuda(target, same, prompt, 40, gamma=gamma)
    assert res.tokens == ar and res.stats["alpha"] == 1.0
    other = decoder_of(draft_kw, wd, **mode)  # an unrelated draft: mostly rejected
    res2 = speculative_generate_cuda(target, other, prompt, 40, gamma=gamma)
    assert res2.tokens == ar
    assert res2.stats["alpha"] < 1.0


# ---- bounds that catch model bugs (issue #16) -------------------------------------------------------------
# Against the float64 model, the logits of the bf16 decoder differ by as much as a 5% scale of the last
# layer's down projection or a dropped k-projection bias change them (tests/test_bf16_tolerance.py simulates
# it on the CPU), so the logits check above cannot see such bugs. Two quantities with less rounding in front
# of them can; tests/test_bf16_tolerance.py shows on a CPU simulation of the decoder's bf16 buffers
# (tests/bf16_sim.py) that the correct model lies inside both bounds and each bug outside.
BF16_U = 2.0 ** -8  # bf16 spacing relative to the value: a round-to-nearest error is at most BF16_U / 2
K0_KAPPA = 2.0  # layer 0's K: xn, the product, + bias, after rope: 4 roundings of at most BF16_U / 2 each
RESID_KAPPA = 7.5  # final residual of a one-layer model, relative L2 per position, in BF16_U (simulated)
ONE_LAYER = [dict(CONFIGS[0], num_hidden_layers=1), LONG_K]
# (an 8-token step: "ours1" runs it in cuBLAS)
BOUND_MODES = [dict(gemv="ours1"), dict(gemv="ours"), dict(gemv="ours", qkv_epilogue=True)]


def k0_excess(k_dev: np.ndarray, k_ref: np.ndarray, k_acc: np.ndarray) -> float:
    """max |sorted K - sorted K_ref| / (K0_KAPPA * BF16_U * accumulation) over (position, head); K (T, Hkv, D).
    Sorting each head's D values makes the check independent of the order the decoder keeps them in (its rope
    pairs rows), and sorting never increases a max-norm distance, so the bound still holds."""
    err = np.abs(np.sort(k_dev, -1) - np.sort(k_ref, -1))
    return float(np.max(err / (K0_KAPPA * BF16_U * k_acc.max(-1, keepdims=True))))


def resid_excess(resid_dev: np.ndarray, resid_ref: np.ndarray) -> float:
    """max over positions of |resid - resid_ref|_2 / |resid_ref|_2 / (RESID_KAPPA * BF16_U)."""
    rel = np.linalg.norm(resid_dev - resid_ref, axis=-1) / np.linalg.norm(resid_ref, axis=-1)
    return float(rel.max() / (RESID_KAPPA * BF16_U))


@pytest.mark.parametrize("mode", BOUND_MODES, ids=["ours1-cublas", "ours", "ours-qkvepi"])
@pytest.mark.parametrize("cfg_kw", CONFIGS + ONE_LAYER, ids=["tied-gqa2", "untied-gqa6", "hd128", "1layer", "long-k"])
def test_cuda_decoder_k_cache_and_residual_within_bf16_bounds(cfg_kw, mode):
    from bf16_sim import forward
    from cuda_helpers import from_bf16_bits

    _, w = build(cfg_kw, FastBackend)
    wb = {k: round_bf16(v) for k, v in w.items()}
    dec = decoder_of(cfg_kw, w, **mode)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    _, ref = forward(cfg_kw, wb, prompt)  # float64, same bf16 weights
    dec.set_position(0)
    dec.run(prompt, all_logits=True, advance=True)
    dec.stream.synchronize()
    T = len(prompt)
    k0 = from_bf16_bits(dec.layers[0]["k"][:, :T].get()).astype(np.float64).transpose(1, 0, 2)  # (T, Hkv, D)
    assert k0_excess(k0, ref["k0"], ref["k0_acc"]) <= 1.0
    if cfg_kw["num_hidden_layers"] == 1:
        assert resid_excess(dec.resid[:T].get().astype(np.float64), ref["resid"]) <= 1.0
