"""The persistent decode step (kernels/persistent.cu, CudaDecoder(persistent=True)): every layer of a
1- or 2-token step in one cooperative kernel. GPU only.

Reference: tests/bf16_sim.py's float64 forward with the device's bf16 weights, rounding to bf16 exactly what
the persistent step stores in bf16 (the K / V cache after bias and rope, the LM head's input) and nothing
else: the step keeps every other activation in fp32. A whole sequence runs through persistent steps (1- and
2-token steps), so the remaining difference is fp32 against float64 arithmetic, which now and then (about
2.5e-4 of the values: fp32's ~1e-6 relative error of a sum against bf16's half step of 2^-9) makes a stored
value round to its other bf16 neighbour. These random weights make the logits sensitive to the KV cache
(rounding every stored value toward zero instead moves them by 1-6% of their scale), so a few such flips
move them by ~0.1-0.3%: the logits are held to 1% of their scale (the many-kernel decoder, which stores
every activation in bf16, is held to 5% in test_cuda_model.py). Shapes cover both ways a block splits its
products (fewer units than warps: K split over warps; more: a warp a unit over several rounds), several
attention splits, head sizes 16, 64 and 128, 8 query heads a kv head (the 16-row limit at 2 tokens); a long
context covers the largest split size. A build with -DPT_BROKEN=1 (a token does not see its own key) fails
them (tools/gpu_issue14.sh pt).
"""
from __future__ import annotations

import numpy as np
import pytest

import minitorch
from minitorch import FastBackend
from bf16_sim import forward, round_bf16_f64
from cuda_helpers import needs_gpu, round_bf16
from test_cuda_model import CONFIGS, build, decoder_of

pytestmark = [pytest.mark.gpu, needs_gpu]

WIDE = dict(vocab_size=300, hidden_size=128, intermediate_size=4352, num_hidden_layers=2, num_attention_heads=8,
            num_key_value_heads=1, tie_word_embeddings=True, rope_theta=10000.0)  # 4352 units > 16 a block
HD64 = dict(vocab_size=151, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, tie_word_embeddings=False, rope_theta=1e6)  # head size 64
PT_CONFIGS = CONFIGS + [WIDE, HD64]
PT_IDS = ["tied-gqa2", "untied-gqa6", "hd128", "wide-gqa8", "hd64"]
REL = 0.01  # logits against the simulation: max error <= REL * max |reference logit| + REL
STEPS = [1] * 30 + [2] + [1] * 20 + [2, 2] + [1] * 15 + [2]  # 75 tokens: > 64 keys, several attention splits


def check_close(got, ref, rel=REL):
    err = np.abs(got - ref).max()
    assert err <= rel * np.abs(ref).max() + rel, f"max error {err:.4g}, reference scale {np.abs(ref).max():.4g}"


@pytest.mark.parametrize("i", range(len(PT_CONFIGS)), ids=PT_IDS)
def test_persistent_steps_match_simulation(i):
    from minitorch.models import Qwen2Config

    cfg_kw = PT_CONFIGS[i]
    _, w = build(cfg_kw, FastBackend, seed=3)
    wb = {k: round_bf16(v) for k, v in w.items()}
    ids = [int(x) for x in np.random.default_rng(i).integers(0, cfg_kw["vocab_size"], sum(STEPS))]
    kw = dict(products=False, only={"k", "v", "xn_final"}, eps=Qwen2Config(**cfg_kw).rms_norm_eps)
    ref, _ = forward(cfg_kw, wb, ids, round=round_bf16_f64, **kw)
    dec = decoder_of(cfg_kw, w, max_len=96, max_tokens=16, gemv="ours", persistent=True)
    dec.set_position(0)
    p = 0
    for n, T in enumerate(STEPS):
        dec.run(ids[p:p + T], all_logits=True, advance=False, graph=n > 0)  # eager once, then the graphs
        dec.stream.synchronize()
        got = dec.logits[:T].get().astype(np.float64)
        for t in range(T):
            check_close(got[t], ref[p + t])
        p += T
        dec.set_position(p)
    assert not dec.persistent_failed()


def test_persistent_long_context_largest_splits():
    """2 kv heads over 8,600 keys: splits of 128 keys (PT_KS_MAX), more attention items than blocks. The prompt
    goes through the many-kernel prefill, so the bound is that path's (test_cuda_model.py: 5%)."""
    cfg_kw = dict(CONFIGS[0], num_hidden_layers=1)
    cpu, w = build(cfg_kw, FastBackend, seed=4)
    cpu.load_weights({k: round_bf16(v) for k, v in w.items()})
    n = 8600
    prompt = [int(x) for x in np.random.default_rng(5).integers(0, cfg_kw["vocab_size"], n)]
    steps = [prompt[-1:], [3], [4, 5]]
    ref = []
    with minitorch.no_grad():
        cache = cpu.new_cache(n + 8)
        for c in range(0, n, 512):  # chunks: the score matrix stays small
            last = cpu(prompt[c:c + 512], cache)
        ref.append(np.asarray(last.to_numpy(), np.float64)[0, -1])
        for s in steps[1:]:
            ref.append(np.asarray(cpu(s, cache).to_numpy(), np.float64)[0, -1])
    dec = decoder_of(cfg_kw, w, max_len=n + 8, max_tokens=128, gemv="ours", persistent=True)
    dec.prefill(prompt[:-1])
    for s, r in zip(steps, ref):
        dec.run(s, all_logits=True, advance=False, graph=True)
        dec.stream.synchronize()
        check_close(dec.logits[len(s) - 1].get().astype(np.float64), r, rel=0.05)
        dec.set_position(int(dec.pos.get()[0]) + len(s))
    assert not dec.persistent_failed()


def test_persistent_step_is_deterministic():
    cfg_kw = PT_CONFIGS[3]
    _, w = build(cfg_kw, FastBackend, seed=6)
    dec = decoder_of(cfg_kw, w, max_len=128, max_tokens=16, gemv="ours", persistent=True)
    dec.prefill(list(range(1, 40)))
    p = int(dec.pos.get()[0])
    outs = []
    for _ in range(3):
        dec.set_position(p)
        dec.run([11, 12], all_logits=True, advance=False, graph=True)
        dec.stream.synchronize()
        outs.append((dec.logits[:2].get().copy(), dec.layers[1]["k"][:, p:p + 2].get().copy()))
    for a, b in outs[1:]:
        np.testing.assert_array_equal(a, outs[0][0])
        np.testing.assert_array_equal(b, outs[0][1])


def test_persistent_refuses_unsupported_shapes():
    cfg_kw = dict(CONFIGS[0], num_attention_heads=16, num_key_value_heads=1, hidden_size=128)  # 16 heads a kv head
    _, w = build(cfg_kw, FastBackend)
    with pytest.raises(ValueError, match="persistent"):
        decoder_of(cfg_kw, w, persistent=True)
    _, w0 = build(CONFIGS[0], FastBackend)
    with pytest.raises(ValueError, match="persistent"):
        decoder_of(CONFIGS[0], w0, persistent=True, silu="down")


@pytest.mark.parametrize("gamma", [1, 4, 7])
def test_greedy_speculative_with_persistent_draft_equals_greedy(gamma):
    from minitorch.generation.cuda import generate_cuda, speculative_generate_cuda

    _, wt = build(CONFIGS[0], FastBackend, seed=1)
    target = decoder_of(CONFIGS[0], wt, gemv="ours")
    prompt = [5, 17, 42, 8, 1, 30]
    ar = generate_cuda(target, prompt, 40).tokens
    same = decoder_of(CONFIGS[0], wt, gemv="ours", persistent=True)  # the target's weights: nearly all accepted
    res = speculative_generate_cuda(target, same, prompt, 40, gamma=gamma)
    assert res.tokens == ar and res.stats["alpha"] >= 0.9
    draft_kw = dict(CONFIGS[0], hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                    num_hidden_layers=1)
    _, wd = build(draft_kw, FastBackend, seed=2)
    other = decoder_of(draft_kw, wd, gemv="ours", persistent=True)
    res2 = speculative_generate_cuda(target, other, prompt, 40, gamma=gamma)
    assert res2.tokens == ar and res2.stats["alpha"] < 1.0
    assert not same.persistent_failed() and not other.persistent_failed()
