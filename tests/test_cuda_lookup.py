"""Prompt lookup on the device (kernels/lookup.cu), --draft-extend's looked-up drafts: ngram_lookup against
lookup_reference (tests/test_generation_cuda_host.py: the rule written plainly, itself tied to NGramDrafter
there), on random short-alphabet contexts (matches everywhere, at the context / draft boundary, copies that
run past the end) and on long contexts whose only match lies thousands of tokens back (the kernel walks
back a block of starts at a time); context_append against its definition. GPU only. A broken build (the earliest
match instead of the latest: cuda_helpers.BROKEN_KERNELS["lookup"]) fails the first two tests.
"""
from __future__ import annotations

import numpy as np
import pytest

from cuda_helpers import needs_gpu, use_broken_kernels
from test_generation_cuda_host import lookup_reference, lookup_select_reference

pytestmark = [pytest.mark.gpu, needs_gpu]


def run_lookup(ctx, drafts, k, max_n, slack=4):
    """ngram_lookup over ctx + drafts; returns the k tokens it wrote and checks it wrote nothing else."""
    import cupy as cp

    from minitorch.cuda.launch import LOOKUP_THREADS
    from minitorch.cuda.runtime import kernels

    gq = len(drafts)
    cbuf = cp.asarray(np.asarray(list(ctx) + [-7] * slack, np.int64))
    clen = cp.asarray(np.asarray([len(ctx)], np.int32))
    ttok = np.full(1 + gq + k + slack, -9, np.int64)
    ttok[1:1 + gq] = drafts
    t = cp.asarray(ttok)
    kernels().launch("ngram_lookup", (1,), (LOOKUP_THREADS,),
                     (t, cbuf, clen, np.int32(gq), np.int32(k), np.int32(max_n)))
    got = t.get()
    assert got[0] == -9 and list(got[1:1 + gq]) == list(drafts) and np.all(got[1 + gq + k:] == -9)
    assert int(clen.get()[0]) == len(ctx)
    return [int(x) for x in got[1 + gq:1 + gq + k]]


def test_lookup_matches_the_reference_on_random_contexts():
    r = np.random.default_rng(0)
    for case in range(300):
        V, max_n = int(r.integers(2, 10)), int(r.integers(1, 4))
        ctx = [int(x) for x in r.integers(0, V, int(r.integers(1, 60)))]
        drafts = [int(x) for x in r.integers(0, V, int(r.integers(0, 6)))]
        k = int(r.integers(1, 8))
        assert run_lookup(ctx, drafts, k, max_n) == lookup_reference(ctx + drafts, k, max_n), (case, ctx, drafts)


@pytest.mark.parametrize("n_ctx", [600, 2000, 5000])
def test_lookup_on_long_contexts(n_ctx):
    """Many blocks of starts: the latest match when it is recent, in a middle block, or only far back."""
    r = np.random.default_rng(n_ctx)
    base = [int(x) for x in r.integers(100, 5000, n_ctx)]  # few accidental matches
    for where in [n_ctx - 20, n_ctx // 2, 3]:
        ctx = list(base)
        ctx[where:where + 3] = [7, 8, 9]
        ctx[where + 3:where + 8] = [11, 12, 13, 14, 15]
        for drafts in ([7, 8, 9], [7, 8], [9]):
            got = run_lookup(ctx, drafts, 4, 3)
            assert got == lookup_reference(ctx + drafts, 4, 3)
        # a second, earlier occurrence with other tokens after it: the latest one wins
        early = list(ctx)
        early[1:4] = [7, 8, 9]
        early[4:8] = [21, 22, 23, 24]
        if where > 8:
            assert run_lookup(early, [7, 8, 9], 4, 3) == [11, 12, 13, 14]


def test_lookup_without_a_match_repeats_the_last_token():
    assert run_lookup([1, 2, 3], [4], 3, 3) == [4, 4, 4]
    assert run_lookup([5], [], 2, 3) == [5, 5]


def test_context_append():
    import cupy as cp

    from minitorch.cuda.runtime import kernels

    ctx = cp.asarray(np.arange(10, dtype=np.int64) + 100)
    clen = cp.asarray(np.asarray([4], np.int32))
    out = cp.asarray(np.asarray([2, 7, 8, 9, -1], np.int64))  # n = 2: d_1, d_2, next
    kernels().launch("context_append", (1,), (128,), (ctx, clen, out, np.int32(10)))
    assert list(ctx.get()) == [100, 101, 102, 103, 7, 8, 9, 107, 108, 109] and int(clen.get()[0]) == 7
    out = cp.asarray(np.asarray([4, 1, 2, 3, 4, 5], np.int64))  # 5 tokens, 3 places left: capped
    kernels().launch("context_append", (1,), (128,), (ctx, clen, out, np.int32(10)))
    assert list(ctx.get()[7:]) == [1, 2, 3] and int(clen.get()[0]) == 10


def test_a_lookup_taking_the_earliest_match_fails_the_first_two_tests(monkeypatch):
    use_broken_kernels(monkeypatch, "lookup")
    for check in (test_lookup_matches_the_reference_on_random_contexts, lambda: test_lookup_on_long_contexts(600)):
        with pytest.raises(AssertionError):
            check()


def run_select(ctx, drafts, k, min_n, slack=4):
    """ngram_select over ctx with the round's drafts in ttok[1..]: the k tokens there afterwards (the drafts when it
    selected nothing), checking it wrote nothing else."""
    import cupy as cp

    from minitorch.cuda.launch import LOOKUP_THREADS
    from minitorch.cuda.runtime import kernels

    cbuf = cp.asarray(np.asarray(list(ctx) + [-7] * slack, np.int64))
    clen = cp.asarray(np.asarray([len(ctx)], np.int32))
    ttok = np.full(1 + k + slack, -9, np.int64)
    ttok[1:1 + k] = drafts
    t = cp.asarray(ttok)
    kernels().launch("ngram_select", (1,), (LOOKUP_THREADS,),
                     (t, cbuf, clen, np.int32(k), np.int32(3), np.int32(min_n)))
    got = t.get()
    assert got[0] == -9 and np.all(got[1 + k:] == -9) and int(clen.get()[0]) == len(ctx)
    return [int(x) for x in got[1:1 + k]]


def test_select_matches_the_reference_on_random_and_long_contexts():
    """--draft-lookup's kernel: prompt lookup's tokens where an n-gram of min_n or more matched, else the drafts
    untouched; random short-alphabet contexts, then a long one whose 3-gram match lies far back."""
    r = np.random.default_rng(1)
    for case in range(300):
        V, min_n, k = int(r.integers(2, 10)), int(r.integers(1, 4)), int(r.integers(1, 8))
        ctx = [int(x) for x in r.integers(0, V, int(r.integers(1, 60)))]
        drafts = [int(x) for x in r.integers(100, 200, k)]
        want = lookup_select_reference(ctx, k, min_n)
        assert run_select(ctx, drafts, k, min_n) == (drafts if want is None else want), (case, ctx, min_n)
    base = [int(x) for x in np.random.default_rng(5).integers(100, 5000, 3000)]
    ctx = base[:10] + [7, 8, 9, 11, 12] + base[10:] + [7, 8, 9]
    assert run_select(ctx, [1, 2, 3, 4], 4, 3) == [11, 12] + base[10:12]
    assert run_select(ctx[:-2] + [8, 10], [1, 2, 3, 4], 4, 2) == [1, 2, 3, 4]  # 8, 10 never occurred: untouched
