"""The 8-bit LM head of a speculative draft (kernels/lmhead.cu, CudaDecoder(lm_head_int8=True)).

CPU: quantize_rows_int8's codes reconstruct every weight within half a scale step (numpy).
GPU: lmhead_i8_f32 against a float64 product of the same codes and scales; a decoder's logits with the
8-bit head against that reference from its own normalised hidden row, and within the quantisation bound
of the bf16 head's; greedy speculative decoding with an 8-bit-head draft equals greedy decoding (the
sampling tests in test_cuda_sampling.py run the same draft too). A -DLH_BROKEN=1 build (every row's last
16 codes left out) should fail the kernel test. Written in round 8; none of the GPU tests here has run yet
(tools/gpu_issue14.sh next).
"""
from __future__ import annotations

import numpy as np
import pytest

from minitorch.cuda.decoder import quantize_rows_int8


def test_quantize_rows_int8_reconstructs_within_half_a_step():
    r = np.random.default_rng(0)
    w = (r.standard_normal((40, 48)) * r.uniform(0.01, 3, (40, 1))).astype(np.float32)
    w[7] = 0.0  # an all-zero row
    w[9, 5] = -50.0  # one outlier: its row's scale follows it
    codes, scale = quantize_rows_int8(np, w)
    assert codes.dtype == np.int8 and scale.dtype == np.float32 and scale.shape == (40,)
    assert codes.min() >= -127 and codes.max() <= 127
    assert np.all(np.abs(codes[9, 5]) == 127) and scale[7] == 1.0 and not codes[7].any()
    err = np.abs(codes.astype(np.float64) * scale[:, None] - w)
    assert np.all(err <= scale[:, None] / 2 * (1 + 1e-6))
    assert np.all(np.abs(codes).max(axis=1)[np.abs(w).max(axis=1) > 0] == 127)  # the range is used


def _gpu():
    from cuda_helpers import needs_gpu  # noqa: F401  (skips without a GPU)

    from minitorch.cuda.runtime import cuda_available

    if not cuda_available():
        pytest.skip("no GPU available")


@pytest.mark.gpu
@pytest.mark.parametrize("N,K", [(1000, 896), (77, 16), (300, 1536), (33, 8192)])
def test_lmhead_kernel_matches_float64(N, K):
    _gpu()
    import cupy as cp

    from minitorch.cuda.runtime import kernels

    r = np.random.default_rng(N + K)
    codes = r.integers(-127, 128, (N, K)).astype(np.int8)
    scale = r.uniform(0.001, 0.05, N).astype(np.float32)
    x = r.standard_normal(K).astype(np.float32)
    xb = (x.view(np.uint32) >> 16).astype(np.uint16)  # bf16 (truncated): the kernel reads these bits
    xf = (xb.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    y = cp.full(N, np.nan, cp.float32)
    kernels().launch("lmhead_i8_f32", ((N + 31) // 32,), (256,),
                     (cp.asarray(codes), cp.asarray(scale), cp.asarray(xb), y, np.int32(N), np.int32(K)))
    terms = codes.astype(np.float64) * xf[None, :]
    want = terms.sum(1) * scale
    bound = 1e-5 * np.abs(terms).sum(1) * scale + 1e-30
    got = y.get().astype(np.float64)
    assert np.all(np.abs(got - want) <= bound), np.abs(got - want).max()


@pytest.mark.gpu
def test_decoder_logits_with_the_int8_head():
    _gpu()
    import cupy as cp

    from minitorch import FastBackend
    from test_cuda_model import CONFIGS, build, decoder_of

    _, w = build(CONFIGS[1], FastBackend, seed=4)  # untied head, hidden 96
    ids = [3, 14, 15, 92, 65, 35]
    out = {}
    for q8 in (False, True):
        dec = decoder_of(CONFIGS[1], w, gemv="ours", lm_head_int8=q8)
        dec.prefill(ids[:-1])
        dec.run(ids[-1:], all_logits=False, advance=False)
        dec.stream.synchronize()
        out[q8] = (dec.logits[0, :dec.nv].get().astype(np.float64), dec.xn[0].get())
        if q8:
            codes, scale = dec.lm_head_q.get(), dec.lm_head_s.get()
    xn = (out[True][1].astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    terms = codes.astype(np.float64) * xn[None, :]
    want = terms.sum(1) * scale
    np.testing.assert_allclose(out[True][0], want, rtol=0, atol=1e-5 * (np.abs(terms).sum(1) * scale).max())
    # against the bf16 head: each logit moves by at most sum|x| * scale / 2 (+ the bf16 head's own rounding)
    bound = np.abs(xn).sum() * scale / 2 + 1e-3 * np.abs(out[False][0]).max()
    assert np.all(np.abs(out[True][0] - out[False][0]) <= bound)


@pytest.mark.gpu
@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_speculative_with_int8_head_draft_equals_greedy(gamma):
    _gpu()
    from test_cuda_sampling import PROMPT, pair

    from minitorch.generation.cuda import generate_cuda, speculative_generate_cuda

    target, draft = pair(lm_head_int8=True)
    greedy = generate_cuda(target, PROMPT, 40).tokens
    res = speculative_generate_cuda(target, draft, PROMPT, 40, gamma=gamma)
    assert res.tokens == greedy and res.stats["draft_forwards"] > 0
