"""Filling a prompt's cache with padded graph steps (CudaDecoder.fill_cache, graph_prefill=True, CLI
--gpu-prefill graph) instead of eager prefill steps.

CPU: the chunking, padding and positions of fill_cache on a recording stand-in for the decoder, and which of
the two paths generation takes. GPU: in the exact modes (steps of <= 16 rows: a token's products and attention
do not depend on the row count) the filled caches equal an eager prefill's bit for bit; a chunk whose padded
rows would pass max_len runs eagerly; greedy generation and greedy speculative decoding give the eager path's
tokens. Round 10, call 1 (H200): 13 passed.
"""
from __future__ import annotations

import numpy as np
import pytest

from minitorch.cuda.decoder import CudaDecoder
from minitorch.generation.cuda import _prefill_all_but_last


class Recorder:
    """The parts of a CudaDecoder that fill_cache uses; records every step and position set."""

    def __init__(self, max_tokens: int, max_len: int) -> None:
        self.max_tokens, self.max_len = max_tokens, max_len
        self.calls: list = []
        self.pos = 0
        self.stream = self
        self.synced = 0

    def set_position(self, p: int) -> None:
        self.calls.append(("pos", p))
        self.pos = p

    def run(self, ids, all_logits=True, advance=True, graph=False) -> None:
        assert not all_logits and advance
        self.calls.append(("graph" if graph else "eager", self.pos, list(ids)))
        self.pos += len(ids)

    def synchronize(self) -> None:
        self.synced += 1


def test_fill_cache_pads_each_chunk_to_one_graph_shape():
    dec = Recorder(max_tokens=4, max_len=64)
    prompt = list(range(10, 20))  # 10 tokens: chunks of 4, 4, 2
    CudaDecoder.fill_cache(dec, prompt)
    steps = [c for c in dec.calls if c[0] != "pos"]
    assert steps == [("graph", 0, [10, 11, 12, 13]), ("graph", 4, [14, 15, 16, 17]), ("graph", 8, [18, 19, 19, 19])]
    assert dec.calls[0] == ("pos", 0) and dec.calls[-1] == ("pos", 10) and dec.pos == 10 and dec.synced == 1


def test_fill_cache_runs_a_chunk_eagerly_where_padding_would_pass_the_cache():
    dec = Recorder(max_tokens=4, max_len=10)
    CudaDecoder.fill_cache(dec, list(range(9)))  # the last chunk (1 token at 8) padded to 4 would reach 12 > 10
    steps = [c for c in dec.calls if c[0] != "pos"]
    assert steps == [("graph", 0, [0, 1, 2, 3]), ("graph", 4, [4, 5, 6, 7]), ("eager", 8, [8])]
    assert dec.pos == 9


class Decoder:
    """What _prefill_all_but_last touches: which fill it asks for, and the pending token it sets."""

    def __init__(self, graph_prefill: bool) -> None:
        self.graph_prefill, self.log = graph_prefill, []
        self.stream, self.tokens = self, self

    def fill_cache(self, p):
        self.log.append(("fill_cache", p))

    def prefill(self, p):
        self.log.append(("prefill", p))

    def __getitem__(self, _):  # tokens[:1]
        return self

    def set(self, ids, stream=None):  # tokens[:1].set(...)
        self.log.append(("next", [int(i) for i in ids]))

    def __enter__(self):  # with dec.stream
        return self

    def __exit__(self, *exc):
        return False


def test_generation_fills_the_cache_the_way_the_decoder_says():
    for flag, kind in ((True, "fill_cache"), (False, "prefill")):
        dec = Decoder(flag)
        _prefill_all_but_last(dec, [5, 6, 7])
        assert dec.log == [(kind, [5, 6]), ("next", [7])]


# ------------------------------------------------------------------ GPU
def _gpu():
    from minitorch.cuda.runtime import cuda_available

    if not cuda_available():
        pytest.skip("no GPU available")


EXACT = [dict(gemv="ours"), dict(gemv="tc")]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", EXACT, ids=["ours", "tc"])
@pytest.mark.parametrize("n", [2, 5, 16, 17, 40])
def test_filled_cache_equals_eager_prefill_bitwise(n, mode):
    _gpu()
    from minitorch import FastBackend
    from test_cuda_model import CONFIGS, build, decoder_of

    _, w = build(CONFIGS[0], FastBackend, seed=3)
    prompt = [int(t) for t in np.random.default_rng(n).integers(1, CONFIGS[0]["vocab_size"], n)]
    caches = []
    for graph in (False, True):
        dec = decoder_of(CONFIGS[0], w, **mode)  # max_tokens 16: chunks of at most 16 rows
        if graph:
            dec.fill_cache(prompt)
        else:
            dec.prefill(prompt)
        dec.stream.synchronize()
        assert int(dec.pos.get()[0]) == n
        caches.append([(lw["k"][:, :n].get(), lw["v"][:, :n].get()) for lw in dec.layers])
    for (k0, v0), (k1, v1) in zip(*caches):
        np.testing.assert_array_equal(k1, k0)
        np.testing.assert_array_equal(v1, v0)


@pytest.mark.gpu
def test_fill_cache_near_the_end_of_the_cache():
    _gpu()
    from minitorch import FastBackend
    from minitorch.generation.cuda import generate_cuda
    from test_cuda_model import CONFIGS, build, decoder_of

    _, w = build(CONFIGS[0], FastBackend, seed=4)
    prompt = [1 + i % 90 for i in range(85)]  # the last chunk (5 tokens at 80) padded to 16 would pass 90
    out = [generate_cuda(decoder_of(CONFIGS[0], w, max_len=90, gemv="ours", graph_prefill=g), prompt, 4).tokens
           for g in (False, True)]
    assert out[1] == out[0]


@pytest.mark.gpu
@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_speculative_with_filled_caches_equals_greedy(gamma):
    _gpu()
    from minitorch.generation.cuda import generate_cuda, speculative_generate_cuda
    from test_cuda_sampling import PROMPT, pair

    target, draft = pair()
    target.graph_prefill = draft.graph_prefill = True
    prompt = PROMPT * 4  # 24 tokens: two chunks of the test decoders' 16 rows
    greedy = generate_cuda(target, prompt, 40).tokens
    res = speculative_generate_cuda(target, draft, prompt, 40, gamma=gamma)
    assert res.tokens == greedy and res.stats["draft_forwards"] > 0
    target.graph_prefill = draft.graph_prefill = False
    assert generate_cuda(target, prompt, 40).tokens == greedy  # the eager path's tokens (exact mode)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [3, 16, 37])
def test_decoder_features_are_the_models_hidden_states_in_bf16(n, monkeypatch):
    """A draft head's training features by the CUDA decoder's prefill (project/training/features.py DecoderRows,
    train_draft_head.py --features-by decoder) against the float64 model's final normed hidden states: every row
    within twice the distance that bf16 storage alone puts between them (tests/bf16_sim.py's simulation of the
    decoder's bf16 buffers, same bf16 weights: 0.017-0.031 of a row's norm here), over chunks of 16 rows (one
    partial, one whole, several). A copy that puts every chunk at row 0 (the chunk's offset lost) is caught."""
    _gpu()
    from bf16_sim import forward, round_bf16_f64
    from minitorch import FastBackend
    from project.training.features import DecoderRows
    from test_cuda_model import CONFIGS, build, decoder_of

    cfg = CONFIGS[0]
    _, w = build(cfg, FastBackend, seed=5)
    ids = [int(t) for t in np.random.default_rng(n).integers(1, cfg["vocab_size"], n)]
    ref = forward(cfg, w, ids)[1]["xn"]  # float64
    sim = forward(cfg, {k: round_bf16_f64(v) for k, v in w.items()}, ids, round=round_bf16_f64)[1]["xn"]

    def worst(x):
        assert x.shape == ref.shape
        return float((np.linalg.norm(x - ref, axis=1) / np.linalg.norm(ref, axis=1)).max())

    bound = 2 * worst(sim)
    dec = decoder_of(cfg, w, max_len=n + 16, max_tokens=16)
    assert worst(DecoderRows(dec)(ids)) <= bound
    if n > 16:
        fill = dec.fill_cache
        monkeypatch.setattr(dec, "fill_cache", lambda p, after_chunk: fill(p, lambda s, m: after_chunk(0, m)))
        assert worst(DecoderRows(dec)(ids)) > 10 * bound
