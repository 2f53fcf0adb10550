"""The GPU speculative engine's host logic (minitorch/generation/cuda.py) on the CPU, greedy: decoders whose
"device" buffers are numpy arrays and whose kernels (gather_drafts, spec_accept's greedy branch, a step,
decode_advance, ngram_lookup, context_append) are Python ports of kernels/sampling.cu, kernels/decode.cu and
kernels/lookup.cu (ngram_lookup's port is lookup_reference, the plain statement of its rule that the GPU test
tests/test_cuda_lookup.py holds the kernel to; a test here ties it to NGramDrafter). What this checks is the
engine: positions, the draft's first-step sizes, the draft's share gq of a round and the looked-up tokens of
--draft-extend (DecoderDrafter.lookup_steps), the verify graph's inputs. The kernels themselves are tested on
the GPU (tests/test_cuda_sampling.py); a port that drifted from them would not be caught here.

The models are lookup tables: the next token is a function of the last two (a deterministic "language"
that repeats itself, so prompt lookup finds continuations). A step at position p over T tokens writes
them at p..p+T-1 and predicts from the prefix up to each row, as a KV cache does; stale positions past a
rollback are overwritten before anything reads them, as on the device.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from minitorch.generation.cuda import DecoderDrafter, speculative_generate_cuda

V = 12


class Arr(np.ndarray):
    """A numpy array with CuPy's get / set."""

    def get(self, stream=None):
        return np.array(self)

    def set(self, x, stream=None):
        self[...] = x


def arr(n, dtype=np.int64):
    return np.zeros(n, dtype).view(Arr)


class Stream:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self):
        pass


class Event:
    def record(self, stream=None):
        pass


FAKE_CP = SimpleNamespace(cuda=SimpleNamespace(Event=Event, get_elapsed_time=lambda a, b: 0.0))


def table(seed, like=None, noise=0.0):
    """next token = table[a, b] for the last two tokens a, b."""
    r = np.random.default_rng(seed)
    t = r.integers(1, V, (V, V)) if like is None else like.copy()
    if like is not None:
        flip = r.random((V, V)) < noise
        t[flip] = r.integers(1, V, flip.sum())
    return t


def lookup_reference(seq, k, max_n=3):
    """kernels/lookup.cu ngram_lookup's k tokens after seq (the context, then the draft's tokens), written
    plainly: the longest n-gram (n <= max_n) ending seq with an earlier occurrence, its latest one, the tokens
    after it copied forward (past seq's end from the copy itself); no match: seq's last token repeated."""
    s, N = list(seq), len(seq)
    src = N - 1
    for n in range(min(max_n, N - 1), 0, -1):
        starts = [i for i in range(N - n) if s[i:i + n] == s[N - n:]]
        if starts:
            src = starts[-1] + n
            break
    for i in range(k):
        s.append(s[src + i])
    return s[N:]


def lookup_select_reference(seq, k, min_n, max_n=3):
    """kernels/lookup.cu ngram_select's k tokens for the context seq, or None (the drafts left as they were): the
    longest n-gram (min_n <= n <= max_n) ending seq with an earlier occurrence, its latest one, the tokens after it
    copied forward (past seq's end from the copy itself)."""
    s, N = list(seq), len(seq)
    for n in range(min(max_n, N - 1), min_n - 1, -1):
        starts = [i for i in range(N - n) if s[i:i + n] == s[N - n:]]
        if starts:
            src = starts[-1] + n
            for i in range(k):
                s.append(s[src + i])
            return s[N:]
    return None


def test_lookup_select_reference_is_the_cpu_heads_lookup():
    """Where the CPU engine's head drafts by prompt lookup (drafters.lookup_match with min_ngram M), the device rule
    selects the same tokens (copying on to k past the context's end); where lookup_match finds no n-gram of M or
    more, it selects nothing."""
    from minitorch.generation.drafters import lookup_match

    r = np.random.default_rng(1)
    for case in range(400):
        V_, min_n, k = int(r.integers(2, 8)), int(r.integers(1, 4)), int(r.integers(1, 7))
        seq = [int(t) for t in r.integers(0, V_, int(r.integers(1, 40)))]
        want, n = lookup_match(seq, k, 3, min_n)
        got = lookup_select_reference(seq, k, min_n)
        if not want:
            assert got is None, (case, seq, k, min_n)
        else:
            assert n >= min_n and len(got) == k and got[:len(want)] == want, (case, seq, k, min_n)


def test_lookup_reference_extends_the_ngram_drafter():
    """Where NGramDrafter proposes, the device rule proposes the same tokens (then copies on to k); where it
    finds nothing, the last token repeated. Random short-alphabet sequences: matches at every boundary."""
    from minitorch.generation import SamplingConfig
    from minitorch.generation.drafters import NGramDrafter

    r = np.random.default_rng(0)
    for case in range(400):
        V_, max_n, k = int(r.integers(2, 8)), int(r.integers(1, 4)), int(r.integers(1, 7))
        seq = [int(t) for t in r.integers(0, V_, int(r.integers(1, 40)))]
        want, _ = NGramDrafter(max_ngram=max_n).propose(seq, k, SamplingConfig(), r)
        got = lookup_reference(seq, k, max_n)
        assert len(got) == k and got[:len(want)] == want, (case, seq, k, max_n)
        if not want:
            assert got == [seq[-1]] * k
        elif len(want) < k:  # the copy ran past the end: it repeats the span it copied from
            period = len(want)
            assert all(got[i] == got[i - period] for i in range(period, k))


class Launcher:
    def __init__(self, dec):
        self.dec = dec

    def launch(self, name, grid, block, args, cluster=None):
        getattr(self, name)(*args)

    @staticmethod
    def gather_drafts(ttok, history, dpos, g):  # kernels/sampling.cu
        for j in range(int(g)):
            ttok[1 + j] = history[int(dpos[0]) - int(g) + 1 + j]

    def spec_accept(self, p, ldp, argmax, q, ldq, qV, Q, dpos, drafts, g, gq, V_, tpos, ttok, dtok, out, rng):
        """kernels/sampling.cu spec_accept, greedy (p null): the same reads and writes in the same order."""
        assert isinstance(p, np.uint64) and int(p) == 0, "greedy only"
        g, gq = int(g), int(gq)
        p0, pending = int(tpos[0]), int(ttok[0])
        n = 0
        while n < g and drafts[n] == argmax[n]:
            n += 1
        nxt = int(argmax[n])
        out[0] = n
        out[1:1 + n] = drafts[:n]
        out[1 + n] = nxt
        tpos[0] = p0 + n + 1
        ttok[0] = nxt
        if not isinstance(dpos, np.uint64):
            if n >= gq:
                dpos[0] = p0 + gq
                for j in range(n - gq + 1):
                    dtok[j] = drafts[gq - 1 + j] if gq - 1 + j >= 0 else pending
                dtok[n - gq + 1] = nxt
            else:
                dpos[0] = p0 + n + 1
                dtok[0] = nxt

    @staticmethod
    def ngram_lookup(ttok, ctx, ctx_len, gq, k, max_n):  # kernels/lookup.cu
        L, gq = int(ctx_len[0]), int(gq)
        seq = list(ctx[:L]) + list(ttok[1:1 + gq])
        ttok[1 + gq:1 + gq + int(k)] = lookup_reference(seq, int(k), int(max_n))

    @staticmethod
    def ngram_select(ttok, ctx, ctx_len, k, max_n, min_n):  # kernels/lookup.cu
        got = lookup_select_reference(list(ctx[:int(ctx_len[0])]), int(k), int(min_n), int(max_n))
        if got is not None:
            ttok[1:1 + int(k)] = got

    @staticmethod
    def context_append(ctx, ctx_len, out, cap):  # kernels/lookup.cu
        L, n = int(ctx_len[0]), int(out[0])
        for j in range(n + 1):
            if L + j < int(cap):
                ctx[L + j] = out[1 + j]
        ctx_len[0] = min(L + n + 1, int(cap))


class FakeDecoder:
    """The parts of CudaDecoder that generation/cuda.py uses, greedy."""

    def __init__(self, tab, max_len=256, max_tokens=16):
        self.tab, self.max_len, self.max_tokens = tab, max_len, max_tokens
        self.V = self.nv = V
        self.config = SimpleNamespace(max_position_embeddings=max_len, vocab_size=V)
        self.cp, self.stream, self.k = FAKE_CP, Stream(), Launcher(self)
        self.tokens, self.next_ids, self.spec_out = arr(max_tokens), arr(max_tokens), arr(max_tokens + 2)
        self.history, self.pos = arr(max_len + max_tokens), arr(1, np.int32)
        self.context, self.context_len = arr(max_len + max_tokens + 2), arr(1, np.int32)
        self.seq = np.zeros(max_len + max_tokens, np.int64)  # the "KV cache": the token at each position
        self.sampling, self.probs, self.rng, self.sample_cluster = None, None, None, 1
        self.graph_prefill, self.graph_refs, self.steps = False, {}, []

    def predict(self, upto):
        a, b = (self.seq[upto - 2], self.seq[upto - 1]) if upto >= 2 else (0, self.seq[0])
        return int(self.tab[a, b])

    def _step(self, T, all_logits, advance):
        p = int(self.pos[0])
        self.seq[p:p + T] = self.tokens[:T]
        for t in range(T):
            self.next_ids[t] = self.predict(p + t + 1)
        self.steps.append(T)
        if advance:  # kernels/decode.cu decode_advance
            self.history[p + T] = self.next_ids[T - 1]
            self.tokens[0] = self.next_ids[T - 1]
            self.pos[0] = p + T

    def replay(self, T, all_logits=True, advance=True):
        self._step(T, all_logits, advance)

    def graph(self, key, enqueue, warm, kernel_names=()):
        enqueue()

    def prefill(self, ids):
        self.seq[:len(ids)] = ids
        self.pos[0] = len(ids)

    def set_position(self, p):
        self.pos[0] = p

    def set_sampling(self, temperature=0.0, top_k=0, top_p=1.0, seed=0):
        assert temperature == 0.0

    def limit_vocab(self, n):
        self.nv = n

    def share_stream(self, other):
        self.stream = other.stream


def greedy(tab, prompt, n):
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(tab[seq[-2], seq[-1]]))
    return seq[len(prompt):]


TARGET = table(1)
PROMPT = [3, 5, 7, 3, 5, 7, 2]


@pytest.mark.parametrize("steps, gamma", [(None, 4), (4, 7), (3, 7), (2, 4), (1, 3)])
@pytest.mark.parametrize("draft_kind", ["same", "close", "far"])
def test_speculative_with_lookup_equals_greedy(steps, gamma, draft_kind):
    tab = {"same": TARGET, "close": table(2, like=TARGET, noise=0.15), "far": table(3)}[draft_kind]
    target, draft = FakeDecoder(TARGET), FakeDecoder(tab)
    res = speculative_generate_cuda(target, DecoderDrafter(draft, lookup_steps=steps), PROMPT, 60, gamma=gamma)
    assert res.tokens == greedy(TARGET, PROMPT, 60)
    st = res.stats
    assert st["draft_forwards"] <= st["rounds"] * min(steps or gamma, gamma)  # the draft's share of each round
    assert max(draft.steps) <= draft.max_tokens and max(target.steps) <= gamma + 1
    if draft_kind == "same":  # every draft token is accepted: only looked-up ones can miss
        acc = st["per_position_acceptance"]
        assert all(a == 1.0 for a in acc[:steps or gamma])
        if steps and gamma > steps:
            assert st["accepted"] > st["draft_forwards"]  # looked-up tokens were accepted too
            assert max(draft.steps) > 2  # the draft then caught up on them in one longer step


def test_broken_catch_up_is_detected(monkeypatch):
    """A spec_accept that forgets the accepted looked-up tokens in the draft's next input (the pre-lookup
    behaviour, [d_gq, next] only) leaves the draft's cache with gaps: its drafts go wrong and, with the draft
    equal to the target, the first draft position is no longer always accepted."""
    real = Launcher.spec_accept

    def forgetful(self, p, ldp, argmax, q, ldq, qV, Q, dpos, drafts, g, gq, V_, tpos, ttok, dtok, out, rng):
        real(self, p, ldp, argmax, q, ldq, qV, Q, dpos, drafts, g, gq, V_, tpos, ttok, dtok, out, rng)
        n, gq = int(out[0]), int(gq)
        if not isinstance(dpos, np.uint64) and n > gq:
            dtok[1] = out[1 + n]  # [d_gq, next]: the looked-up tokens never reach the draft

    monkeypatch.setattr(Launcher, "spec_accept", forgetful)
    target, draft = FakeDecoder(TARGET), DecoderDrafter(FakeDecoder(TARGET), lookup_steps=3)
    monkeypatch.setattr(FakeDecoder, "replay", lambda self, T, all_logits=True, advance=True:
                        self._step(2 if T > 2 else T, all_logits, advance))
    res = speculative_generate_cuda(target, draft, PROMPT, 60, gamma=6)
    assert res.tokens == greedy(TARGET, PROMPT, 60)  # the target still decides every token
    assert res.stats["per_position_acceptance"][0] < 1.0


def test_capture_speculative_graphs_covers_every_round_shape():
    """The warm-up's capture runs a verify of every draft count 0..gamma (a run's last rounds draft fewer) and
    the draft's longer first steps; a run afterwards is still greedy decoding."""
    from minitorch.generation.cuda import capture_speculative_graphs

    target, draft = FakeDecoder(TARGET), DecoderDrafter(FakeDecoder(TARGET), lookup_steps=3)
    capture_speculative_graphs(target, draft, PROMPT, 7)
    assert set(target.steps) == set(range(1, 9))  # verify steps of 1..8 rows: 0..7 drafts
    assert set(range(1, 7)) <= set(draft.device.steps)  # first steps of up to 7 - 3 + 2 tokens
    assert speculative_generate_cuda(target, draft, PROMPT, 40, gamma=7).tokens == greedy(TARGET, PROMPT, 40)


def test_host_ngram_drafter_equals_greedy():
    """The host drafter's path (NGramDrafter: the host writes its drafts, proposing from the context the
    engine keeps for it) gives greedy decoding, and its drafts are accepted (the "language" repeats itself)."""
    from minitorch.generation.drafters import NGramDrafter

    target = FakeDecoder(TARGET)
    res = speculative_generate_cuda(target, NGramDrafter(), PROMPT, 60, gamma=4)
    assert res.tokens == greedy(TARGET, PROMPT, 60)
    assert res.stats["accepted"] > 0


def test_bare_draft_decoder_is_a_decoder_drafter_without_lookup():
    """A draft decoder passed as it is drafts every token of a round over the whole vocabulary (as_gpu_drafter)."""
    from minitorch.generation.cuda import HostDrafter, as_gpu_drafter
    from minitorch.generation.drafters import NGramDrafter

    dec = FakeDecoder(TARGET)
    d = as_gpu_drafter(dec)
    assert isinstance(d, DecoderDrafter) and d.device is dec and d.lookup_steps is None and d.propose_vocab is None
    assert as_gpu_drafter(d) is d and isinstance(as_gpu_drafter(NGramDrafter()), HostDrafter)
    res = speculative_generate_cuda(FakeDecoder(TARGET), dec, PROMPT, 40, gamma=4)
    assert res.tokens == greedy(TARGET, PROMPT, 40) and res.stats["draft_forwards"] > 0
