"""A decoder whose cache is far longer than the context (the CLI's 32k positions) computes the bits of
one sized for the context: the attention's partial blocks loop over the splits that hold visible keys
(kernels/attention.cu) and attn_combine merges only those. GPU only."""
from __future__ import annotations

import numpy as np
import pytest

from cuda_helpers import needs_gpu
from minitorch import FastBackend
from test_cuda_model import CONFIGS, build, decoder_of

pytestmark = [pytest.mark.gpu, needs_gpu]

PROMPT = [int(x) for x in np.random.default_rng(5).integers(0, 97, 70)]  # 70 keys: 3 splits of 32


def run_decoder(cfg_kw, w, max_len, gemv, slots=None, monkeypatch=None, broken=False):
    """Prefill, 12 graph-replayed decode steps, a 5-token verify step at a later position (graph),
    the caches: everything a speculative round reads."""
    import minitorch.cuda.decoder as cd

    if slots is not None:  # a few split slots: each partial block loops over several splits
        monkeypatch.setattr(cd, "ATT_SLOT_BLOCKS", 1)
        monkeypatch.setattr(cd, "ATT_MIN_SLOTS", slots)
    dec = decoder_of(cfg_kw, w, max_len=max_len, max_tokens=16, gemv=gemv, attn_kb=32)
    if broken:  # the partial kernel told there are only as many splits as blocks: no loop
        launch = dec.k.launch

        def no_loop(name, grid, block, args, *a, **kw):
            if name.startswith("attn_partial"):
                args = args[:-1] + (np.int32(grid[0]),)
            return launch(name, grid, block, args, *a, **kw)

        dec.k.launch = no_loop
    first = dec.prefill(PROMPT)
    toks = dec.decode(12)
    p = len(PROMPT) + 3
    dec.set_position(p)
    dec.run([first, 7, 3, 9, 12], all_logits=True, advance=False, graph=True)
    dec.stream.synchronize()
    caches = [lw[kv][:, :p + 5].get().copy() for lw in dec.layers for kv in ("k", "v")]
    return first, toks, dec.logits[:5].get().copy(), caches


def assert_same(a, b):
    assert a[0] == b[0] and a[1] == b[1]
    np.testing.assert_array_equal(b[2], a[2])
    for x, y in zip(a[3], b[3]):
        np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("slots", [None, 1, 2])
@pytest.mark.parametrize("gemv", ["ours", "ours1"])
def test_long_cache_gives_the_bits_of_a_short_cache(gemv, slots, monkeypatch):
    _, w = build(CONFIGS[0], FastBackend, seed=6)
    short = run_decoder(CONFIGS[0], w, 96, gemv)  # 3 splits, one block each
    long = run_decoder(CONFIGS[0], w, 8192, gemv, slots, monkeypatch)  # 256 splits; 1-2 slots loop over them
    assert_same(short, long)


def test_long_cache_check_catches_a_missing_split_loop(monkeypatch):
    """The comparison above fails when the partial blocks do not loop over the later splits (two
    slots, 3+ visible splits: the third split's keys are never read)."""
    _, w = build(CONFIGS[0], FastBackend, seed=6)
    short = run_decoder(CONFIGS[0], w, 96, "ours")
    broken = run_decoder(CONFIGS[0], w, 8192, "ours", 2, monkeypatch, broken=True)
    with pytest.raises(AssertionError):
        assert_same(short, broken)


def test_long_cache_speculative_equals_autoregressive(monkeypatch):
    """The engine on 8k-position caches: greedy speculative (exact verify) == greedy target alone,
    and both equal the short-cache target's output."""
    from minitorch.generation.cuda import generate_cuda, speculative_generate_cuda

    _, wt = build(CONFIGS[0], FastBackend, seed=1)
    draft_kw = dict(CONFIGS[0], hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                    num_hidden_layers=1)
    _, wd = build(draft_kw, FastBackend, seed=2)
    ref = generate_cuda(decoder_of(CONFIGS[0], wt, max_len=160, gemv="ours", attn_kb=32), PROMPT, 60).tokens
    target = decoder_of(CONFIGS[0], wt, max_len=8192, gemv="ours", attn_kb=32)
    draft = decoder_of(draft_kw, wd, max_len=8192, gemv="ours", attn_kb=32)
    assert generate_cuda(target, PROMPT, 60).tokens == ref
    res = speculative_generate_cuda(target, draft, PROMPT, 60, gamma=4)
    assert res.tokens == ref and res.stats["alpha"] < 1.0
