"""Programmatic dependent launch (minitorch/cuda/pdl.py): a CudaDecoder launching its step kernels
with PDL must compute exactly what the ordinary launches compute (eager steps, captured graphs,
verify steps, greedy speculative decoding). GPU only; kept in its own file so a driver-level failure
of cuLaunchKernelEx cannot take the other GPU tests down with it."""
from __future__ import annotations

import numpy as np
import pytest

from cuda_helpers import needs_gpu

pytestmark = [pytest.mark.gpu, needs_gpu]

CFG = dict(vocab_size=203, hidden_size=96, intermediate_size=80, num_hidden_layers=3, num_attention_heads=6,
           num_key_value_heads=1, tie_word_embeddings=False, rope_theta=1e6, rms_norm_eps=1e-6)


def weights(cfg: dict, seed: int) -> dict:
    """Random checkpoint-named float32 weights (norm weights near 1)."""
    from types import SimpleNamespace

    import cupy as cp

    from minitorch.cuda.decoder import random_weights

    w = random_weights(SimpleNamespace(**cfg), seed=seed, std=0.15)
    r = cp.random.default_rng(seed + 100)
    for k in w:
        if "norm" in k:  # not all ones: the norm weight must matter
            w[k] = (1 + 0.1 * r.standard_normal(w[k].shape, dtype=cp.float32)).astype(cp.float32)
    return w


def decoder(cfg: dict, w: dict, **kw):
    from types import SimpleNamespace

    from minitorch.cuda.decoder import CudaDecoder

    kw.setdefault("graph_prefill", False)
    return CudaDecoder(SimpleNamespace(**cfg), w, max_len=128, max_tokens=16, **kw)


@pytest.mark.parametrize("gemv", ["ours1", "ours", "tc", "ourstc"])
@pytest.mark.parametrize("norm", ["qkvnorm", "qkvepi"])
def test_pdl_decoder_bitwise_equals_plain_launches(gemv, norm):
    """qkvnorm: the QKV GEMV normalises its input (hidden <= 2048, this config); qkvepi: the down projection's
    epilogue does (larger models)."""
    w = weights(CFG, seed=7)
    outs = []
    for pdl in (False, True):
        dec = decoder(CFG, w, gemv=gemv, pdl=pdl)
        dec.qkv_norm_in_gemv = dec.qkv_norm_in_gemv and norm == "qkvnorm"
        prompt = [5, 17, 42, 8, 1, 30, 99, 150, 7]
        first = dec.prefill(prompt)
        pre = dec.logits[:1].get().copy()  # the prompt step's last-token logits (written to row 0)
        toks = dec.decode(20)  # captured T=1 graph, replayed
        dec.set_position(len(prompt) + 4)
        dec.run([first, 3, 4, 5, 6], all_logits=True, advance=False, graph=True)  # captured verify step
        dec.stream.synchronize()
        ver = dec.logits[:5].get().copy()
        outs.append((first, pre, toks, ver))
    (f0, p0, t0, v0), (f1, p1, t1, v1) = outs
    assert f0 == f1 and t0 == t1
    np.testing.assert_array_equal(p1, p0)
    np.testing.assert_array_equal(v1, v0)


def test_pdl_greedy_speculative_equals_greedy():
    from minitorch.generation.cuda import generate_cuda, speculative_generate_cuda

    w = weights(CFG, seed=8)
    draft_cfg = dict(CFG, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_hidden_layers=1)
    wd = weights(draft_cfg, seed=9)
    target = decoder(CFG, w, gemv="ours", pdl=True)
    prompt = [4, 8, 15, 16, 23, 42]
    ar = generate_cuda(target, prompt, 40).tokens
    ref = generate_cuda(decoder(CFG, w, gemv="ours"), prompt, 40).tokens
    assert ar == ref
    res = speculative_generate_cuda(target, decoder(draft_cfg, wd, gemv="ours", pdl=True), prompt, 40, gamma=4)
    assert res.tokens == ar and res.stats["alpha"] < 1.0
