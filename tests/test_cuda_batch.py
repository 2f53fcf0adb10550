"""Batched decoding on the GPU (minitorch/cuda/batch.py BatchDecoder, kernels gemvtcb* / attn_rows_* / batch_advance /
sample_rows_f32) against the batch-1 decoder it must reproduce: CudaDecoder(gemv="tc") with its exact prefill (chunks of
at most 16 tokens) and one-token decode steps (generation/cuda.py generate_cuda).

Greedy: every sequence of a batch, admitted and refilled by the continuous-batching scheduler (generation/batch.py
run_batch) with fewer slots than requests, equals its batch-1 output bit for bit, in slots of 1 and of 3, for head sizes
64 and 128. Sampled: each row draws what a batch-1 decode with its seed draws (equal tokens), and the first token of a
row follows the model's distribution (chi-square over many seeds against a float64 softmax of its logits row). Broken
variants fail: the attention reading another row's cache (patched kernel source), a refilled slot decoding from its
previous sequence's position (stale KV), every row drawing with one row's generator. Bad input is one ValueError line.
GPU only.
"""
from __future__ import annotations

import numpy as np
import pytest

from cuda_helpers import needs_gpu, use_broken_kernels

pytestmark = [pytest.mark.gpu, needs_gpu]

# head sizes 64 (4 query heads over 2 kv heads) and 128 (the test models' CONFIGS[2])
BATCH_CONFIGS = [
    dict(vocab_size=211, hidden_size=256, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
         num_key_value_heads=2, tie_word_embeddings=False, rope_theta=10000.0),
    dict(vocab_size=130, hidden_size=256, intermediate_size=352, num_hidden_layers=2, num_attention_heads=2,
         num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1e6),
]
MAX_LEN = 128


def _prompts(vocab, n=7, seed=0):
    r = np.random.default_rng(seed)
    lens = [1, 5, 17, 40, 3, 26, 9][:n]
    news = [12, 30, 7, 25, 18, 5, 22][:n]
    return [[int(t) for t in r.integers(1, vocab, k)] for k in lens], news


def _models(cfg, seed=3):
    from minitorch import FastBackend
    from test_cuda_model import build, decoder_of

    model, w = build(cfg, FastBackend, seed=seed)
    return model, decoder_of(cfg, w, max_len=MAX_LEN, max_tokens=16, gemv="tc")


def _batch1(dec, prompt, n, cfg=None):
    from minitorch.generation.cuda import generate_cuda

    return generate_cuda(dec, prompt, n, cfg).tokens


def _batched(dec, prompts, news, slots, cfgs=None):
    from minitorch.generation import SamplingConfig
    from minitorch.generation.batch import BatchRequest, run_batch

    bd = dec.batch_decoder(slots=slots, max_len=MAX_LEN)
    reqs = [BatchRequest(p, n, sampling=(cfgs[i] if cfgs else None), key=i) for i, (p, n) in enumerate(zip(prompts, news))]
    out = {}
    for res in run_batch(bd, reqs, SamplingConfig(), stop_ids=()):
        assert res.key not in out
        out[res.key] = res.result.tokens
    assert sorted(out) == list(range(len(prompts)))
    return [out[i] for i in range(len(prompts))]


@pytest.mark.parametrize("slots", [1, 3])
@pytest.mark.parametrize("ci", [0, 1], ids=["d64", "d128"])
def test_batched_greedy_equals_batch1_bitwise(ci, slots):
    cfg = BATCH_CONFIGS[ci]
    _, dec = _models(cfg)
    prompts, news = _prompts(cfg["vocab_size"])
    want = [_batch1(dec, p, n) for p, n in zip(prompts, news)]
    assert _batched(dec, prompts, news, slots) == want


@pytest.mark.parametrize("multi_tile", [True, False], ids=["tcm", "tcb"])
def test_a_wide_batch_equals_batch1_bitwise(multi_tile, monkeypatch):
    """40 sequences in 37 slots: decode steps of 37 rows (three tiles) and admissions of several prompts a step."""
    from minitorch.cuda.batch import BatchDecoder

    cfg = BATCH_CONFIGS[0]
    _, dec = _models(cfg)
    r = np.random.default_rng(9)
    prompts = [[int(t) for t in r.integers(1, cfg["vocab_size"], 1 + (7 * i) % 45)] for i in range(40)]
    news = [4 + (5 * i) % 23 for i in range(40)]
    want = [_batch1(dec, p, n) for p, n in zip(prompts, news)]
    real = BatchDecoder.__init__
    monkeypatch.setattr(BatchDecoder, "__init__",
                        lambda self, *a, **kw: real(self, *a, **dict(kw, multi_tile=multi_tile, prefill_tokens=100)))
    assert _batched(dec, prompts, news, 37) == want


def test_rows_reading_another_rows_cache_fail(monkeypatch):
    cfg = BATCH_CONFIGS[0]
    _, dec = _models(cfg)
    prompts, news = _prompts(cfg["vocab_size"])
    want = [_batch1(dec, p, n) for p, n in zip(prompts, news)]
    use_broken_kernels(monkeypatch, "attention_rows")
    assert _batched(dec, prompts, news, 3) != want


def test_a_refilled_slot_decoding_from_its_old_position_fails(monkeypatch):
    from minitorch.cuda.batch import BatchDecoder

    cfg = BATCH_CONFIGS[0]
    _, dec = _models(cfg)
    prompts, news = _prompts(cfg["vocab_size"])
    want = [_batch1(dec, p, n) for p, n in zip(prompts, news)]
    real = BatchDecoder._arm

    def stale(self, slots, first, lens, settings):  # a reused slot keeps its previous position and cache
        used = getattr(self, "_used", set())
        old = self.pos.get()
        real(self, slots, first, lens, settings)
        for s in slots:
            if int(s) in used:
                self.pos[int(s)] = int(old[int(s)])
        self._used = used | {int(s) for s in slots}

    monkeypatch.setattr(BatchDecoder, "_arm", stale)
    got = _batched(dec, prompts, news, 3)
    assert got[:3] == want[:3]  # the first occupants of the slots are right ...
    assert got != want  # ... the refilled ones are not


SAMPLED = [dict(temperature=0.8, top_k=0, top_p=1.0), dict(temperature=1.0, top_k=20, top_p=0.9),
           dict(temperature=0.6, top_k=0, top_p=0.8)]


def test_batched_sampling_draws_what_batch1_draws():
    from minitorch.generation import SamplingConfig

    cfg = BATCH_CONFIGS[1]
    _, dec = _models(cfg)
    prompts, news = _prompts(cfg["vocab_size"])
    cfgs = [SamplingConfig(seed=100 + i, **SAMPLED[i % 3]) if i != 4 else SamplingConfig()
            for i in range(len(prompts))]  # request 4 greedy among sampled ones
    want = [_batch1(dec, p, n, c) for p, n, c in zip(prompts, news, cfgs)]
    assert _batched(dec, prompts, news, 3, cfgs) == want
    assert len({tuple(w) for w in want}) == len(want)


def test_a_seed_draws_the_same_tokens_whatever_the_prefill_chunking():
    """generate_cuda restarts the sampler's counter after the prompt's prefill steps (which draw): new token i draws
    with counter i, as a batch row does, whether the prompt is prefilled in chunks of 4 or of 16 tokens."""
    from minitorch import FastBackend
    from minitorch.generation import SamplingConfig
    from test_cuda_model import build, decoder_of

    cfg = BATCH_CONFIGS[1]
    _, w = build(cfg, FastBackend, seed=3)
    prompt = [int(t) for t in np.random.default_rng(2).integers(1, cfg["vocab_size"], 23)]
    sc = SamplingConfig(temperature=1.0, top_k=20, top_p=0.9, seed=7)
    outs = [_batch1(decoder_of(cfg, w, max_len=MAX_LEN, max_tokens=m, gemv="tc"), prompt, 30, sc) for m in (4, 16)]
    assert outs[0] == outs[1]


def _first_tokens(dec, prompt, seeds, slots=64):
    """The first new token of `prompt` under each seed (temperature 1), admitted `slots` at a time."""
    from minitorch.generation import SamplingConfig

    bd = dec.batch_decoder(slots=slots, max_len=MAX_LEN)
    out = []
    for s0 in range(0, len(seeds), slots):
        part = seeds[s0:s0 + slots]
        out += bd.admit([(j, prompt, SamplingConfig(temperature=1.0, seed=s)) for j, s in enumerate(part)])
        for j in range(len(part)):
            bd.release(j)
    return np.array(out)


def _chi2_p(tokens, probs):
    from test_generation_distribution import pooled_pvalue

    return pooled_pvalue([int(t) for t in tokens], {i: float(p) for i, p in enumerate(probs)})


def _target_probs(dec, prompt):
    """The model's next-token distribution after prompt: a float64 softmax of the logits row the batch decoder's
    LM head computes (greedy admission), independent of the sampling kernel under test."""
    from minitorch.generation import SamplingConfig

    bd = dec.batch_decoder(slots=1, max_len=MAX_LEN)
    bd.admit([(0, prompt, SamplingConfig())])
    row = bd.logits[:bd.nv].get().astype(np.float64)
    p = np.exp(row - row.max())
    return p / p.sum()


def test_a_row_of_a_batch_follows_the_models_distribution():
    cfg = BATCH_CONFIGS[1]
    _, dec = _models(cfg, seed=5)
    prompt = [7, 3, 99, 41, 12]
    probs = _target_probs(dec, prompt)
    toks = _first_tokens(dec, prompt, list(range(3000)))
    assert _chi2_p(toks, probs) > 1e-3


def test_rows_sharing_one_generator_fail_the_distribution_test(monkeypatch):
    import minitorch.cuda.batch as batch

    cfg = BATCH_CONFIGS[1]
    _, dec = _models(cfg, seed=5)
    prompt = [7, 3, 99, 41, 12]
    probs = _target_probs(dec, prompt)
    real = batch._row_settings
    monkeypatch.setattr(batch, "_row_settings", lambda c: real(c)[:3] + (0,))  # every row seed 0
    toks = _first_tokens(dec, prompt, list(range(3000)))
    assert _chi2_p(toks, probs) < 1e-6


def test_bad_requests_are_one_line():
    cfg = BATCH_CONFIGS[0]
    _, dec = _models(cfg)
    bd = dec.batch_decoder(slots=2, max_len=32)
    for prompt, n, word in (([], 4, "empty prompt"), ([1] * 30, 4, "exceeds"), ([1, 2], 0, "max_new_tokens"),
                            ([1, 10 ** 6], 3, "vocabulary")):
        with pytest.raises(ValueError, match=word) as e:
            bd.check(prompt, n)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="GiB") as e:
        dec.batch_decoder(slots=2 ** 20, max_len=MAX_LEN)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="at least 1"):
        dec.batch_decoder(slots=0, max_len=MAX_LEN)


@pytest.mark.parametrize("kind", ["tcb", "tcm"])
@pytest.mark.parametrize("T", [1, 16, 37, 130])
@pytest.mark.parametrize("N,K", [(211, 256), (9000, 256), (256, 352)])
def test_batched_tc_gemv_equals_the_one_token_gemv_bitwise(T, N, K, kind):
    """gemvtcb[w] (a block a tile of 16 tokens) and gemvtcm (4 tiles a block) over T tokens give each token the bits
    gemvtc16 gives it alone."""
    import cupy as cp

    from minitorch.cuda.runtime import kernels
    from cuda_helpers import to_bf16_bits

    r = np.random.default_rng(T + N + K)
    w = cp.asarray(to_bf16_bits((r.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)))
    x = cp.asarray(to_bf16_bits(r.standard_normal((T, K)).astype(np.float32)))
    z = np.uint64(0)
    wide = N > 8192
    y = cp.full((T, N), np.nan, cp.float32)
    name, grid = (("gemvtcm_bf16", ((T + 63) // 64, -(-N // 16))) if kind == "tcm" else
                  (f"gemvtcb{'w' if wide else ''}_bf16", ((T + 15) // 16, -(-N // (16 if wide else 8)))))
    kernels().launch(name, grid, (256,),
                     (w, x, z, np.float32(0), z, y, z, np.int32(N), np.int32(K), np.int32(T), np.int32(K)))
    for t in range(T):
        y1 = cp.full((1, N), np.nan, cp.float32)
        kernels().launch(f"gemvtc16{'w' if wide else ''}_bf16", (-(-N // (16 if wide else 8)),), (256,),
                         (w, x[t:t + 1], z, np.float32(0), z, y1, z, np.int32(N), np.int32(K), np.int32(1), np.int32(K)))
        np.testing.assert_array_equal(y[t].get(), y1[0].get())
