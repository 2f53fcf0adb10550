"""A speculative draft's steps of one and two tokens on 8-bit weight rows (CudaDecoder(int8_weights=True):
kernels/gemv.cu's gemv{1,2}*_i8, one fp32 scale a row; CLI --gpu-draft-weights int8).

CPU: quantize_rows_int8's codes reconstruct every weight within half a scale step (numpy); the CLI flag reaches
the draft's decoder only, and its refusals.
GPU: each 8-bit kernel kind (plain fp32 / residual output, the SwiGLU and add+RMSNorm epilogues, the RMSNorm
input) for 1 and 2 tokens against a float64 product of the same codes, scales and inputs; a decoder run in
steps of one and two tokens against the CPU model holding the dequantized rows; greedy speculative decoding with an 8-bit draft equals
greedy decoding (the sampling tests in test_cuda_sampling.py run the same draft too). A broken build (every row
of a block scaled by the block's first row's scale: cuda_helpers.BROKEN_KERNELS["gemv_i8"]) fails the kernel tests.
Round 10 on the H200: call 1 ran the one-token kernels of the default build (8-code chunks, byte-permute
conversion; the broken build, then -DGEMV_I8_BROKEN=1, failed 16 of 18); call 4 ran this file with the two-token
kernels (all passed with test_cuda_sampling / _prefill / _model: 239; the broken build failed 30 of 32).
"""
from __future__ import annotations

import numpy as np
import pytest

from minitorch.cuda.decoder import quantize_rows_int8


class _Decoder:
    """A stand-in for CudaDecoder that records the keywords each model's decoder was built with."""

    built: list = []

    def __init__(self, cfg, weights, **kw) -> None:
        from minitorch.cuda.decoder import int8_unsupported, resolve_gemv

        if kw.get("int8_weights") and int8_unsupported(cfg):
            raise ValueError(int8_unsupported(cfg))
        kw["gemv"] = resolve_gemv(kw.get("gemv", "auto"))  # as CudaDecoder resolves its defaults
        self.V, self.kw = 100, kw
        _Decoder.built.append((weights, kw))

    @classmethod
    def from_model(cls, model, **kw):
        return cls(model.config, model, **kw)


def _cli(monkeypatch, hidden):
    """cli_common and a parser of its model flags, with a GPU of tensor cores, models of the given hidden
    size and _Decoder standing in (nothing is loaded)."""
    import argparse
    from types import SimpleNamespace

    from project import cli_common

    import minitorch.cuda.decoder as decmod
    import minitorch.cuda.launch as launch
    import minitorch.models as models

    cfg = SimpleNamespace(max_position_embeddings=64, hidden_size=hidden, intermediate_size=4 * hidden,
                          num_attention_heads=2, head_dim=hidden // 2)
    tok = SimpleNamespace(vocab_size=100, stop_token_ids=[0])
    monkeypatch.setattr(cli_common, "require_gpu", lambda: None)
    monkeypatch.setattr(models, "load_model", lambda name, **kw: (SimpleNamespace(config=cfg), tok))
    monkeypatch.setattr(models, "check_compatible", lambda a, b: None)
    monkeypatch.setattr(decmod, "CudaDecoder", _Decoder)
    monkeypatch.setattr(decmod, "weights_from_model", lambda m: m)
    monkeypatch.setattr(launch, "tensor_cores_supported", lambda: True)
    monkeypatch.setattr(decmod, "tensor_cores_supported", lambda: True)
    monkeypatch.setattr(cli_common, "cached_head", lambda target: None)  # no head saved: auto drafts with the model
    from project.settings import add_model_args

    p = argparse.ArgumentParser()
    add_model_args(p)
    _Decoder.built = []
    return cli_common, p


@pytest.mark.parametrize("flags, hidden, draft_int8, draft_gemv", [
    ([], 32, True, "ourstc"), ([], 24, False, "ourstc"), (["--gpu-draft-weights", "int8"], 32, True, "ourstc"),
    (["--gpu-draft-weights", "bf16", "--gpu-draft-gemv", "ours"], 32, False, "ours"),
    (["--fast-verify"], 32, True, "ours1")])
def test_cli_gpu_draft_flags_reach_the_draft_decoder_only(monkeypatch, flags, hidden, draft_int8, draft_gemv):
    cli_common, p = _cli(monkeypatch, hidden)
    from project.settings import resolve_settings

    m = cli_common.load_models(resolve_settings(p.parse_args(["--backend", "cuda"] + flags)), progress=False)
    (_, target_kw), (_, draft_kw) = _Decoder.built
    assert not target_kw.get("int8_weights") and m.target.kw is target_kw and m.draft.kw is draft_kw
    assert draft_kw.get("int8_weights", False) is draft_int8 and draft_kw["gemv"] == draft_gemv
    assert target_kw["gemv"] == ("ours1" if "--fast-verify" in flags else "tc")
    assert target_kw["graph_prefill"] and draft_kw["graph_prefill"]  # the default prefill


def test_cli_gpu_draft_weights_int8_refusals(monkeypatch):
    cli_common, p = _cli(monkeypatch, 24)
    for extra, msg in ([[], "on the GPU: int8_weights needs input sizes"],):
        args = p.parse_args(["--backend", "cuda", "--gpu-gemv", "ours", "--gpu-draft-weights", "int8"] + extra)
        from project.settings import UserError, resolve_settings

        with pytest.raises(UserError, match=msg):
            cli_common.load_models(resolve_settings(args), progress=False)


def test_every_8bit_kernel_the_decoder_asks_for_is_built_and_found():
    """The names CudaDecoder._q8 picks (1 and 2 tokens, every mode, small and big products) are instantiated
    by kernels/gemv.cu's GEMV_I8_INST lines and resolve to that file (runtime.KERNEL_FILES)."""
    import re
    from types import SimpleNamespace

    from minitorch.cuda.decoder import I8_BIG_MODES, I8_MODES, CudaDecoder
    from minitorch.cuda.runtime import SRC_DIR, kernel_file

    src = (SRC_DIR / "gemv.cu").read_text()
    built = set()
    for tm, big in re.findall(r"^GEMV_I8_INST\((\d+), (\d+), \d+\)", src, re.M):
        built |= {f"gemv{tm}{m}_i8" for m in I8_MODES}
        built |= {f"gemv{tm}r{big}{m}_i8" for m in I8_BIG_MODES}
    w = SimpleNamespace(data=SimpleNamespace(ptr=1))
    C = SimpleNamespace(shape=(151936, 896))  # codes of every row any product below asks for
    dec = SimpleNamespace(q8={1: (C, "scales")}, _tc=lambda M: False)
    asked = set()
    for M in (1, 2):
        for mode in I8_MODES:
            for N, K in ((1152, 896), (9728, 896), (151936, 896), (896, 4864)):
                name, rows, codes, scales = CudaDecoder._q8(dec, w, M, N, mode, K)
                assert codes is C and rows in (4, 8, 16) and kernel_file(name) == "gemv"
                asked.add(name)
        assert CudaDecoder._q8(dec, w, M, 900, "_norm", 896) is None  # an input mode without 8-bit kernels
        few = SimpleNamespace(q8={1: (SimpleNamespace(shape=(32768, 896)), "scales")}, _tc=lambda M: False)
        assert CudaDecoder._q8(few, w, M, 32768, "", 896) is not None  # a head's LM head: its head_vocab rows
        assert CudaDecoder._q8(few, w, M, 32769, "", 896) is None  # more rows than were copied: the bf16 ones
    assert CudaDecoder._q8(dec, w, 3, 900, "", 896) is None  # three tokens: the bf16 rows
    dec._tc = lambda M: M > 1  # gemv="ourstc": two tokens in the tensor-core GEMV
    assert CudaDecoder._q8(dec, w, 2, 900, "", 896) is None and CudaDecoder._q8(dec, w, 1, 900, "", 896)
    assert asked <= built, asked - built


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
    from minitorch.cuda.runtime import cuda_available

    if not cuda_available():
        pytest.skip("no GPU available")


# fp32 sums: a thread's chain of at most K / 2048 * 8 fmaf, 5 shuffles, 8 warps, the scale: far below 1e-5 of
# the sum of |terms| for K <= 8192 (a bound, not a statistical tolerance)
SUM_TOL = 1e-5
BF16_ULP = 2.0 ** -8


def _bf16(x):
    from cuda_helpers import round_bf16

    return round_bf16(np.asarray(x, np.float32)).astype(np.float64)


def _case(N, K, seed, T=1):
    """codes (N, K), scales (N,), x (T, K) as bf16 bits and as float64 of the same bf16 values."""
    from cuda_helpers import to_bf16_bits

    r = np.random.default_rng(seed)
    codes = r.integers(-127, 128, (N, K)).astype(np.int8)
    scale = r.uniform(0.001, 0.05, N).astype(np.float32)  # rows of very different scales
    x = r.standard_normal((T, K)).astype(np.float32)
    xb = to_bf16_bits(x)
    return codes, scale, xb, _bf16(x)


def _name(T, big, mode=""):
    """kernels/gemv.cu's 8-bit kernel for T tokens (the decoder's I8_BIG_ROWS rows a block when big) and its rows."""
    from minitorch.cuda.decoder import I8_BIG_ROWS

    rows = I8_BIG_ROWS[T] if big else 4
    return f"gemv{T}{f'r{rows}' if big else ''}{mode}_i8", rows


def _launch(name, rows, N, K, codes, scale, x, nw=None, eps=1e-6, yb=None, yf=None, resid=None, counter=None, T=1):
    import cupy as cp

    from minitorch.cuda.runtime import kernels

    z = np.uint64(0)
    kernels().launch(name, ((N + rows - 1) // rows,), (256,),
                     (cp.asarray(codes), x, nw if nw is not None else z, np.float32(eps), yb if yb is not None else z,
                      yf if yf is not None else z, resid if resid is not None else z, np.int32(N), np.int32(K),
                      np.int32(T), np.int32(K), counter if counter is not None else z, cp.asarray(scale)))
    cp.cuda.runtime.deviceSynchronize()


SHAPES = [(False, 1000, 896), (False, 77, 16), (False, 300, 4864), (False, 33, 8192), (True, 9000, 896),
          (True, 8203, 1536), (True, 40, 8192)]
TOKENS = [1, 2]  # the draft's one-token steps and the two-token step that opens a round after a full acceptance


@pytest.mark.gpu
@pytest.mark.parametrize("T", TOKENS)
@pytest.mark.parametrize("big,N,K", SHAPES)
def test_int8_gemv_matches_float64(big, N, K, T):
    _gpu()
    import cupy as cp

    name, rows = _name(T, big)
    codes, scale, xb, xf = _case(N, K, N + K, T)  # K % 16 == 0 (the 8-bit kernels' 16-code chunks)
    terms = codes.astype(np.float64)[None] * xf[:, None, :]  # (T, N, K)
    want = terms.sum(2) * scale
    bound = SUM_TOL * np.abs(terms).sum(2) * scale + 1e-30
    y = cp.full((T, N), np.nan, cp.float32)
    _launch(name, rows, N, K, codes, scale, cp.asarray(xb), yf=y, T=T)
    got = y.get().astype(np.float64)
    assert np.all(np.abs(got - want) <= bound), np.abs(got - want).max()
    # into the residual stream: resid += product
    r0 = np.random.default_rng(1).standard_normal((T, N)).astype(np.float32)
    resid = cp.asarray(r0)
    _launch(name, rows, N, K, codes, scale, cp.asarray(xb), resid=resid, T=T)
    assert np.all(np.abs(resid.get() - (r0 + want)) <= bound + 1e-6 * np.abs(r0 + want))


@pytest.mark.gpu
@pytest.mark.parametrize("T", TOKENS)
@pytest.mark.parametrize("big,N,K", [(False, 1000, 896), (True, 9728, 896)])
def test_int8_gate_up_swiglu_matches_float64(big, N, K, T):
    _gpu()
    import cupy as cp

    from cuda_helpers import from_bf16_bits

    name, rows = _name(T, big, "_gusilu")
    codes, scale, xb, xf = _case(N, K, 7 + N, T)
    full = (codes.astype(np.float64)[None] * xf[:, None, :]).sum(2) * scale  # rows gate 0, up 0, gate 1, ...
    g, u = _bf16(full[:, 0::2]), _bf16(full[:, 1::2])
    want = g / (1 + np.exp(-g)) * u
    yb = cp.zeros((T, N // 2), cp.uint16)
    _launch(name, rows, N, K, codes, scale, cp.asarray(xb), yb=yb, counter=cp.zeros(1, cp.uint32), T=T)
    got = from_bf16_bits(yb.get()).astype(np.float64)
    # the fp32 gate / up sums may round to a neighbouring bf16: two bf16 steps of the inputs, one of the output
    tol = 3 * BF16_ULP * (np.abs(g / (1 + np.exp(-g))) * np.abs(u) + np.abs(want)) + 1e-6
    assert np.all(np.abs(got - want) <= tol), np.abs(got - want).max()


@pytest.mark.gpu
@pytest.mark.parametrize("T", TOKENS)
@pytest.mark.parametrize("N,K", [(896, 896), (896, 4864), (64, 80)])
def test_int8_resnorm_epilogue_matches_float64(N, K, T):
    _gpu()
    import cupy as cp

    from cuda_helpers import from_bf16_bits, to_bf16_bits

    codes, scale, xb, xf = _case(N, K, 3 + K, T)
    r = np.random.default_rng(5)
    r0 = r.standard_normal((T, N)).astype(np.float32)
    nw = (1 + 0.1 * r.standard_normal(N)).astype(np.float32)
    terms = codes.astype(np.float64)[None] * xf[:, None, :]
    new = r0 + terms.sum(2) * scale
    resid, yb, eps = cp.asarray(r0), cp.zeros((T, N), cp.uint16), 1e-6
    _launch(f"gemv{T}_resnorm_i8", 4, N, K, codes, scale, cp.asarray(xb), nw=cp.asarray(to_bf16_bits(nw)), eps=eps,
            yb=yb, resid=resid, counter=cp.zeros(1, cp.uint32), T=T)
    got_r = resid.get().astype(np.float64)
    assert np.all(np.abs(got_r - new) <= SUM_TOL * np.abs(terms).sum(2) * scale + 1e-6 * np.abs(new))
    inv = 1 / np.sqrt(np.mean(got_r ** 2, axis=1, keepdims=True) + eps)  # from the kernel's own residual rows
    want = _bf16(_bf16(got_r * inv) * _bf16(nw))
    got = from_bf16_bits(yb.get()).astype(np.float64)
    assert np.all(np.abs(got - want) <= 2 * BF16_ULP * np.abs(want) + 1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("i", [1, 2], ids=["untied-gqa6", "hd128"])
def test_int8_decoder_steps_match_cpu_model_on_dequantized_rows(i):
    """Steps of one and two tokens (so every product reads the 8-bit rows), against the CPU model whose
    projections hold codes * scale of the same bf16 weights."""
    _gpu()
    import minitorch
    from cuda_helpers import round_bf16
    from minitorch import FastBackend
    from test_cuda_model import CONFIGS, build, decoder_of

    cfg_kw = CONFIGS[i]
    cpu, w = build(cfg_kw, FastBackend, seed=9)
    wq = {}
    for k, v in w.items():
        v = round_bf16(v)
        if v.ndim == 2 and "embed_tokens" not in k:  # every projection and the (untied) LM head
            codes, scale = quantize_rows_int8(np, v)
            v = (codes.astype(np.float32) * scale[:, None]).astype(np.float32)
        wq[k] = v
    cpu.load_weights(wq)
    dec = decoder_of(cfg_kw, w, gemv="ours", int8_weights=True)
    steps = [[3], [1, 4], [1], [5, 9], [2, 6], [5], [3]]
    dec.set_position(0)
    with minitorch.no_grad():
        cache = cpu.new_cache(64)
        for ids in steps:
            ref = np.asarray(cpu(ids, cache).to_numpy(), np.float64)[0]  # (T, V)
            dec.run(ids, all_logits=True, advance=True)  # the tokens at the next positions
            dec.stream.synchronize()
            got = dec.logits[:len(ids), :dec.nv].get().astype(np.float64)
            assert np.all(np.abs(got - ref).max(1) <= 0.05 * np.abs(ref).max(1) + 0.05)


@pytest.mark.gpu
@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_speculative_with_int8_draft_equals_greedy(gamma):
    _gpu()
    from test_cuda_sampling import PROMPT, pair

    from minitorch.generation.cuda import generate_cuda, speculative_generate_cuda

    target, draft = pair(int8_weights=True)
    greedy = generate_cuda(target, PROMPT, 40).tokens
    res = speculative_generate_cuda(target, draft, PROMPT, 40, gamma=gamma)
    assert res.tokens == greedy and res.stats["draft_forwards"] > 0


@pytest.mark.gpu
def test_int8_gemvs_scaling_rows_by_their_blocks_first_scale_fail(monkeypatch):
    _gpu()
    from cuda_helpers import use_broken_kernels

    use_broken_kernels(monkeypatch, "gemv_i8")
    for big, N, K in (SHAPES[0], SHAPES[4]):
        for T in TOKENS:
            with pytest.raises(AssertionError):
                test_int8_gemv_matches_float64(big, N, K, T)
