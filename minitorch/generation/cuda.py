"""Generation on the GPU fast path: autoregressive and speculative decoding over `CudaDecoder`s
(minitorch/cuda/decoder.py). Every step is a replayed CUDA graph; sampling and the acceptance test run
on the device (kernels/sampling.cu); the host reads back token ids only.

Same rules, arguments and results as the CPU engine (autoregressive.py, speculative.py): a
SamplingConfig (greedy, temperature, top-k, top-p, seed), stop tokens and max_new_tokens cut exactly,
the same statistics. One speculative round is:

    draft:   gamma replays of the draft's one-token graph (its first step feeds [d_gamma, bonus] after a
             fully accepted round: two tokens), each ending in the draft's argmax or sampled token and,
             when sampling, its probability row q kept in a ring. With lookup_steps (--draft-extend) the
             draft makes that many and prompt lookup continues them up to gamma, on the device
             (kernels/lookup.cu, over the target's copy of the run's tokens); the looked-up tokens are point
             masses to the acceptance rule, and after a round that accepted them the draft's first step
             feeds [its last token, the accepted looked-up ones, bonus]
    verify:  one graph = copy the draft's tokens into the target's input (device to device), the lookup
             (--draft-extend), the target step over [pending, d_1..d_gamma], its argmax or filtered
             probability rows p, and spec_accept: the acceptance rule, the correction / bonus draw, both
             caches' positions rolled to the accepted prefix, both decoders' next inputs written (and, with
             lookup, the emitted tokens appended to the target's context)
    read:    [n_accepted, d_1..d_n, next] back to the host: the round's only synchronisation

Both decoders share one stream, so the verify step follows the draft steps without the host waiting.
With a host drafter (NGramDrafter, anything with `propose`) the host writes the proposed tokens into the
target's input instead, and the acceptance rule treats them as point masses (q = 1 at the proposed token).

Drafters on this path share one protocol, `GpuDrafter` (below): `DecoderDrafter(decoder, propose_vocab,
lookup_steps)` is the draft model (a CudaDecoder; --draft-vocab, --draft-extend), `HostDrafter(drafter)` any
host drafter (prompt lookup), `HeadGpuDrafter(head_decoder, lookup_steps)` a trained draft head on the device
(minitorch/cuda/head.py: its first step of a round reads the target's final normed hidden states of the verified
rows straight from the target decoder's buffer, then it drafts from its own features); speculative_generate_cuda
never asks which kind it drives.

Exactness: greedy speculative output equals greedy autoregressive output when the verify step computes
the decode steps' logits bit for bit (CudaDecoder(gemv="tc" or "ours")); "ours1" (--fast-verify) verifies with
cuBLAS, where a near-tie between two logits can resolve differently (minitorch/cuda/decoder.py). Sampled
runs follow the same acceptance rule as the CPU engine with the device's counter-based generator, so a
seed reproduces a GPU run, not the CPU run's tokens.
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..cuda.launch import LOOKUP_THREADS, SAMPLE_THREADS
from .autoregressive import TokenCallback, autoregressive_result, check_request, emit
from .budget import CostBudget
from .drafters import LOOKUP_MAX_NGRAM
from .sampling import SamplingConfig
from .speculative import MAX_ADAPTIVE_GAMMA, next_gamma
from .stats import GenerationResult, SpecStats, Timer

_DRAFT_STREAM = 1  # the draft's random numbers come from a second stream of the same seed
TOPK_CHUNK = 1024  # logits a block of kernels/tree.cu topk_part_f32 reads (4 a thread): a 32,768-id head in 32 blocks


def _check(dec: Any, prompt: list[int], max_new_tokens: int, extra: int) -> None:
    """One clear ValueError for requests the decoder cannot hold: the CPU engine's checks, then its cache."""
    check_request(dec, prompt, max_new_tokens)
    if len(prompt) + max_new_tokens + extra > dec.max_len:
        raise ValueError(f"prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the GPU "
                         f"decoder's cache of {dec.max_len} positions (less {extra} for speculation)")


def _set_sampling(dec: Any, cfg: SamplingConfig, stream: int) -> None:
    seed = (int(cfg.seed) & (2 ** 63 - 1)) | (stream << 63)
    dec.set_sampling(cfg.temperature, cfg.top_k, cfg.top_p, seed)


def _prefill_all_but_last(dec: Any, prompt: list[int], after_chunk: Any = None) -> None:
    """Cache every prompt token but the last, which becomes the next step's input (the CPU engine's
    invariant: the cache holds the context except the pending token). A decoder with graph_prefill fills
    its cache with padded graph steps (CudaDecoder.fill_cache), else eager prefill steps. after_chunk(s, m):
    called after each chunk of m tokens from index s is enqueued (a draft head reads its features)."""
    kw = {} if after_chunk is None else {"after_chunk": after_chunk}
    if len(prompt) > 1:
        if getattr(dec, "graph_prefill", False):
            dec.fill_cache(prompt[:-1], **kw)
        else:
            dec.prefill(prompt[:-1], **kw)
    else:
        dec.set_position(0)
    with dec.stream:
        dec.tokens[:1].set(np.asarray(prompt[-1:], np.int64), stream=dec.stream)


def generate_cuda(dec: Any, prompt_ids: Sequence[int], max_new_tokens: int, cfg: SamplingConfig | None = None,
                  stop_ids: Iterable[int] | None = None, vocab_size: int | None = None,
                  on_tokens: TokenCallback | None = None) -> GenerationResult:
    """Autoregressive generation on a CudaDecoder: the prompt but its last token, then one graph replay
    per new token (the speculative path starts from the same cache, so greedy outputs match bit for bit).
    vocab_size: candidate tokens are the first vocab_size logits (default: all of the decoder's)."""
    cfg = cfg or SamplingConfig()
    prompt = [int(t) for t in prompt_ids]
    _check(dec, prompt, max_new_tokens, 1)
    stops = set(int(s) for s in (stop_ids or ()))
    dec.limit_vocab(min(dec.V, int(vocab_size or dec.V)))
    _set_sampling(dec, cfg, 0)
    timer = Timer()
    t0 = time.perf_counter()
    with timer("prefill"):
        _prefill_all_but_last(dec, prompt)
        # the prefill steps drew a token each and advanced the sampler's counter: restart it, so new token i draws
        # with counter i whatever the prompt's chunking (eager or graph prefill, max_tokens), as the batch decoder's
        # rows do (minitorch/cuda/batch.py)
        _set_sampling(dec, cfg, 0)
    # one step in flight ahead of the host: step i + 1 is queued (decode_advance already wrote its input
    # on the device) before the host waits for token i, copied from the history into pinned memory, so
    # the GPU never idles while the host checks a token. A stop token wastes the one step queued after it.
    cp, stream = dec.cp, dec.stream
    host_mem = cp.cuda.alloc_pinned_memory(16)
    host = np.frombuffer(host_mem, np.int64, 2)
    ready = [cp.cuda.Event(disable_timing=True) for _ in range(2)]
    first = len(prompt)  # history index of the first new token (step i at position len(prompt) - 1 + i)
    item = dec.history.itemsize

    def launch(i: int) -> None:
        dec.replay(1, all_logits=False, advance=True)
        cp.cuda.runtime.memcpyAsync(host.ctypes.data + 8 * (i % 2), dec.history.data.ptr + item * (first + i), 8,
                                    cp.cuda.runtime.memcpyDeviceToHost, stream.ptr)
        ready[i % 2].record(stream)

    out: list[int] = []
    forwards, done = 0, False
    with timer("verify"):
        launch(0)
    while not done:
        with timer("verify"):
            if forwards + 1 < max_new_tokens:
                launch(forwards + 1)
            ready[forwards % 2].synchronize()
            tok = int(host[forwards % 2])
        forwards += 1
        _, done = emit([tok], out, max_new_tokens, stops)
        if on_tokens is not None:
            on_tokens([tok])
    stream.synchronize()  # a step queued after a stop token finishes before the caller reuses the decoder
    return autoregressive_result(out, stops, forwards, timer, time.perf_counter() - t0)  # sampling: on the device


class GpuDrafter:
    """What speculative_generate_cuda drives. `device` is the draft CudaDecoder whose drafts the verify graph
    gathers (its history) and whose q rows the acceptance test reads, or None when the drafts are written into
    the target's input by the host (point masses); `lookup_steps`: the drafter's own tokens a round, continued
    by prompt lookup in the verify graph up to the round's gamma (None: no lookup)."""

    device: Any = None
    lookup_steps: int | None = None

    def check(self, target: Any, prompt: list[int], max_new_tokens: int, limit: int) -> None:
        """Refuse a request this drafter cannot serve (limit: the largest gamma of the run)."""

    def prepare(self, target: Any, vocab: int, cfg: SamplingConfig) -> None:
        """Before the prefill: the shared vocabulary, the sampling settings."""

    def prefill_target(self, target: Any, prompt: list[int]) -> None:
        """Fill the target's cache with the prompt but its last token (a drafter that reads the target's
        features of the prompt interleaves its own steps with the target's chunks)."""
        _prefill_all_but_last(target, prompt)

    def prefill(self, prompt: list[int], max_new_tokens: int, vocab: int) -> None:
        """Take the prompt (the target's cache is being filled meanwhile, on the same stream)."""

    def draft(self, target: Any, g: int, first_T: int, cfg: SamplingConfig) -> tuple[int, int]:
        """Enqueue (or write) a round's drafts; returns (g, gq): the round's drafts and how many are the drafter's
        own (the rest, g - gq, prompt lookup adds in the verify graph)."""
        raise NotImplementedError

    def next_first_T(self, n: int, gq: int) -> int:
        """After a round that accepted n drafts (gq of them the drafter's own): the tokens the next round's first
        draft step feeds, passed to draft() as first_T. A draft decoder feeds [d_gq, accepted lookups, next]
        when its own drafts were all accepted, else [next]."""
        return n - gq + 2 if n >= gq else 1

    def emitted(self, tokens: list[int]) -> None:
        """The tokens a round emitted (accepted drafts, then the correction or bonus)."""

    def capture(self, target: Any, gamma: int) -> None:
        """Capture the drafter's graphs that short runs of every length leave uncaptured (capture_speculative_graphs)."""


class DecoderDrafter(GpuDrafter):
    """The draft model on the device: a CudaDecoder replaying its one-token graphs on the target's stream.
    propose_vocab: propose among the first n token ids only (its LM head computes that slice; --draft-vocab);
    lookup_steps: its tokens a round, continued by prompt lookup (--draft-extend)."""

    def __init__(self, decoder: Any, propose_vocab: int | None = None, lookup_steps: int | None = None) -> None:
        self.device = decoder
        self.propose_vocab = propose_vocab or None
        self.lookup_steps = lookup_steps or None

    def check(self, target: Any, prompt: list[int], max_new_tokens: int, limit: int) -> None:
        dec, steps = self.device, self.lookup_steps
        _check(dec, prompt, max_new_tokens, limit + 2)
        # its first step feeds [its last draft, the accepted looked-up tokens, next]; its ring of q rows holds
        # a round's drafts
        if dec.max_tokens < max(2 + (max(limit - steps, 0) if steps else 0), limit):
            raise ValueError("the draft decoder's max_tokens is too small for this gamma")
        dec.share_stream(target)

    def prepare(self, target: Any, vocab: int, cfg: SamplingConfig) -> None:
        # the draft may propose among fewer tokens (propose_vocab): q = 0 beyond them
        self.device.limit_vocab(min(vocab, self.device.V, self.propose_vocab or vocab))
        _set_sampling(self.device, cfg, _DRAFT_STREAM)

    def prefill(self, prompt: list[int], max_new_tokens: int, vocab: int) -> None:
        _prefill_all_but_last(self.device, prompt)

    def draft(self, target: Any, g: int, first_T: int, cfg: SamplingConfig) -> tuple[int, int]:
        gq = min(g, self.lookup_steps) if self.lookup_steps else g
        if gq > 0:
            self.device.replay(first_T, all_logits=False, advance=True)
            for _ in range(gq - 1):
                self.device.replay(1, all_logits=False, advance=True)
        return g, gq

    def capture(self, target: Any, gamma: int) -> None:
        # its first steps of 2..gamma - steps + 2 tokens (after a round that accepted its tokens and looked-up ones)
        draft, steps = self.device, self.lookup_steps
        draft.set_position(0)
        for T in range(2, min((max(gamma - steps, 0) if steps else 0) + 2, draft.max_tokens) + 1):
            draft.replay(T, all_logits=False, advance=True)


class HeadGpuDrafter(GpuDrafter):
    """A trained draft head on the device (minitorch/cuda/head.py HeadDecoder over the target decoder), the
    CUDA-graph path's HeadDrafter (minitorch/generation/head_drafter.py: the same positions, features and
    tokens). Head position t reads (f_t, x_{t+1}); with a context x_0..x_{n-1} (x_{n-1} pending) a round is

        first step   the positions the last verify step accepted: T = n_accepted + 1 rows of the target's
                     final normed hidden states (its xn rows, on the device) with the tokens that followed them
                     (the accepted drafts and the correction or bonus: spec_out); its position rolled back to
                     the target's less T first -> d_1 (after the prefill: one row, the prompt's last feature)
        g - 1 steps  one row each: the head's own last feature g with the token it just drafted -> d_2..d_g

    so its history and q ring are a draft decoder's (the verify graph gathers its drafts and reads its q rows as a
    DecoderDrafter's). The prefill runs the head over the target's prefill chunks (their xn rows) for positions
    0..n-3 and keeps f_{n-2} for the first round. A one-token prompt has no feature: its first round drafts
    nothing (HeadDrafter proposes nothing there too). A round of g = 0 (only a run's last) skips the head."""

    def __init__(self, head: Any, lookup_steps: int | None = None, lookup_first: int = 0) -> None:
        self.device = head
        self.lookup_steps = lookup_steps or None  # its tokens a round, continued by prompt lookup (--draft-extend)
        # greedy rounds: where an n-gram of lookup_first tokens or more ending the context occurred before, the verify
        # graph replaces the head's drafts by what followed it (kernels/lookup.cu ngram_select; --draft-lookup)
        self.lookup_first = lookup_first
        self._from_target = False  # the next first step reads the target's verify rows (else the head's own)
        self._T = 1
        self._skip = False  # no feature yet: draft nothing
        self._lists: Any = None  # top_k_lists
        self._topk_ws: Any = None  # _top_k's candidate values and ids, a block's top_k each

    def check(self, target: Any, prompt: list[int], max_new_tokens: int, limit: int) -> None:
        head = self.device
        if getattr(head, "target", target) is not target:
            raise ValueError("the draft head's GPU decoder was built over another target decoder")
        _check(head, prompt, max_new_tokens, limit + 2)
        if head.max_tokens < limit + 1:  # its first step feeds up to gamma + 1 rows; its q ring holds gamma
            raise ValueError("the draft head decoder's max_tokens is too small for this gamma")
        head.share_stream(target)

    def prepare(self, target: Any, vocab: int, cfg: SamplingConfig) -> None:
        head = self.device
        head.limit_vocab(min(vocab, head.V, head.head_vocab))  # q = 0 beyond head_vocab
        _set_sampling(head, cfg, _DRAFT_STREAM)

    def prefill_target(self, target: Any, prompt: list[int]) -> None:
        head, n = self.device, len(prompt)
        self._from_target, self._T, self._skip = False, 1, n < 2
        head.set_position(0)
        if n < 2:
            _prefill_all_but_last(target, prompt)
            return
        B = head.max_tokens

        def chunk(s: int, m: int) -> None:  # target xn[0:m] = f_s .. f_{s+m-1}
            rows = min(m, n - 2 - s)  # head positions s .. n-3 read the target's features and prompt[p + 1]
            for r in range(0, max(rows, 0), B):
                k = min(B, rows - r)
                head.feed_rows(target.xn[r:r + k], prompt[s + 1 + r:s + 1 + r + k])
            if s + m - 1 == n - 2:  # the last chunk: f_{n-2} and the pending token feed the first round
                head.set_feature(target.xn[m - 1], prompt[n - 1])

        _prefill_all_but_last(target, prompt, after_chunk=chunk)
        head.set_position(n - 2)

    def draft(self, target: Any, g: int, first_T: int, cfg: SamplingConfig, top_k: int = 0) -> tuple[int, int]:
        """top_k > 0 (a draft tree, cuda_tree.py): after step i the head's top_k tokens there go to row i of
        top_k_lists (_top_k, over the step's logits row)."""
        if g <= 0 or self._skip:
            return 0, 0
        head = self.device
        gq = min(g, self.lookup_steps) if self.lookup_steps else g  # the rest: prompt lookup, in the verify graph
        lists = self.top_k_lists(gq, top_k) if top_k else None
        for i in range(gq):
            if i == 0 and self._from_target:
                head.feed("round", self._T)
            else:
                head.feed("self", 1)
            if lists is not None:
                self._top_k(top_k, lists[i])
        return g, gq

    def _top_k(self, top_k: int, out: Any) -> None:
        """out (top_k,) int64 = the ids of the head's top_k logits at its last step, largest first, ties to the lower
        id: kernels/tree.cu topk_part_f32 over chunks of TOPK_CHUNK logits, then topk_merge_f32 over their lists
        (topk_f32's result; that one block reads every logit: a 3,5,15 tree round drafted 0.41 steps against a gamma-6
        chain's 0.25 on an H100, with these two passes and the head's 8-bit rows 0.27 against 0.22,
        docs/results/gpu_int8_head/)."""
        head = self.device
        nb = -(-head.nv // TOPK_CHUNK)
        if self._topk_ws is None or self._topk_ws[0].size < nb * top_k:
            self._topk_ws = (head.cp.empty(nb * top_k, head.cp.float32), head.cp.empty(nb * top_k, head.cp.int32))
        pv, pi = self._topk_ws
        i32 = np.int32
        with head.stream:
            head.k.launch("topk_part_f32", (nb,), (256,),
                          (head.logits, i32(head.nv), i32(top_k), i32(TOPK_CHUNK), pv, pi))
            head.k.launch("topk_merge_f32", (1,), (256,), (pv, pi, i32(nb * top_k), i32(top_k), out))

    def top_k_lists(self, depth: int, top_k: int) -> Any:
        """The device rows (depth, top_k) that draft(top_k=...) fills: made once, again only for a longer chain or
        another top_k (a captured graph that reads them keeps them alive)."""
        lists = self._lists
        if lists is None or lists.shape[1] != top_k or lists.shape[0] < depth:
            cp = self.device.cp
            lists = self._lists = cp.zeros((max(depth, 1), top_k), cp.int64)
        return lists

    def next_first_T(self, n: int, gq: int) -> int:
        # the target's rows of every accepted token, looked-up ones too, and the correction or bonus: the head's
        # position is rolled back from the target's (head_input_bf16), whatever spec_accept wrote for a draft decoder
        self._from_target, self._T, self._skip = True, n + 1, False
        return n + 1

    def capture(self, target: Any, gamma: int) -> None:
        # a round's first step for every accepted count 0..gamma (the short runs see few of them); the head's
        # cache and position are garbage afterwards (the next run prefills anew)
        target.stream.synchronize()
        if int(target.pos.get(stream=target.stream)[0]) >= gamma + 1:  # the rolled-back position stays >= 0
            for T in range(1, min(gamma + 1, self.device.max_tokens) + 1):
                self.device.feed("round", T)


class HostDrafter(GpuDrafter):
    """A host drafter (NGramDrafter, or anything with start / propose): its tokens are written into the target's
    input before the verify graph, as point masses."""

    def __init__(self, drafter: Any) -> None:
        self.drafter = drafter
        self.context: list[int] = []
        self.rng: Any = None

    def prefill(self, prompt: list[int], max_new_tokens: int, vocab: int) -> None:
        self.drafter.start(prompt, len(prompt) + max_new_tokens, vocab)
        self.context = list(prompt)

    def prepare(self, target: Any, vocab: int, cfg: SamplingConfig) -> None:
        self.rng = cfg.make_rng()  # only for the host drafter's propose() signature

    def draft(self, target: Any, g: int, first_T: int, cfg: SamplingConfig) -> tuple[int, int]:
        if g <= 0:
            return g, g
        drafts, _ = self.drafter.propose(self.context, g, cfg, self.rng)
        if drafts:
            with target.stream:
                target.tokens[1:1 + len(drafts)].set(np.asarray(drafts, np.int64), stream=target.stream)
        return len(drafts), len(drafts)

    def emitted(self, tokens: list[int]) -> None:
        self.context.extend(tokens)


def as_gpu_drafter(drafter: Any) -> GpuDrafter:
    """A GpuDrafter as it is; a host drafter (has `propose`) -> HostDrafter; a draft head's decoder
    (minitorch/cuda/head.py HeadDecoder) -> HeadGpuDrafter; a draft CudaDecoder -> DecoderDrafter over the whole
    shared vocabulary, without lookup."""
    if isinstance(drafter, GpuDrafter):
        return drafter
    if hasattr(drafter, "head_vocab") and hasattr(drafter, "feed"):
        return HeadGpuDrafter(drafter)
    return HostDrafter(drafter) if hasattr(drafter, "propose") else DecoderDrafter(drafter)


def _gather(target: Any, draft: Any, gq: int) -> None:
    """The draft decoder's gq newest tokens into the target's input after the pending token."""
    target.k.launch("gather_drafts", (1,), (128,), (target.tokens, draft.history, draft.pos, np.int32(gq)))


def _verify(target: Any, draft: Any, g: int, gq: int, lookup: bool, select: int = 0) -> None:
    """Replay (capturing on first use) the verify graph for g drafts: gather, lookup, target step, accept.
    The first gq drafts are the draft decoder's; with lookup the rest are prompt lookup's (kernels/lookup.cu,
    point masses to the acceptance rule); a host drafter's (draft None) were written by the host. select = M > 0
    (greedy only: the drafts' q rows are not replaced): after the gather, ngram_select puts prompt lookup's g tokens
    in the drafts' place where an n-gram of M or more tokens ending the context occurred before."""
    i32, i64, z = np.int32, np.int64, np.uint64(0)
    sampled = target.sampling is not None
    if select and sampled:
        raise ValueError("prompt lookup first (select) replaces drafts whose q rows the sampled acceptance reads: "
                         "greedy only")
    key = ("verify", g, gq, lookup, select, id(draft), target.sampling, None if draft is None else draft.sampling)

    def enqueue() -> None:
        if draft is not None and gq > 0:
            _gather(target, draft, gq)
        if select and g > 0:
            target.k.launch("ngram_select", (1,), (LOOKUP_THREADS,),
                            (target.tokens, target.context, target.context_len, i32(g), i32(LOOKUP_MAX_NGRAM),
                             i32(select)))
        if lookup and g > gq:
            target.k.launch("ngram_lookup", (1,), (LOOKUP_THREADS,),
                            (target.tokens, target.context, target.context_len, i32(gq), i32(g - gq),
                             i32(LOOKUP_MAX_NGRAM)))
        target._step(g + 1, True, False)
        q = draft.probs if draft is not None and sampled else z
        C = target.sample_cluster
        target.k.launch("spec_accept", (C,), (SAMPLE_THREADS,),
                        (target.probs if sampled else z, i64(target.nv), target.next_ids, q,
                         i64(draft.nv if draft is not None else 1), i32(draft.nv if draft is not None else 0),
                         i32(draft.max_tokens if draft is not None else 1), draft.pos if draft is not None else z,
                         target.tokens[1:], i32(g), i32(gq), i32(target.nv), target.pos, target.tokens,
                         draft.tokens if draft is not None else z, target.spec_out, target.rng if sampled else z),
                        cluster=(C, 1, 1) if C > 1 else None)
        if lookup or select:
            target.k.launch("context_append", (1,), (128,),
                            (target.context, target.context_len, target.spec_out, i32(target.context.size)))

    target.graph_refs[key] = draft  # the graph holds the draft's buffers: keep it alive with the graph
    target.graph(key, enqueue, lambda: target._step(g + 1, True, False),
                  kernel_names=("gather_drafts", "spec_accept", "ngram_lookup", "ngram_select", "context_append"))


def start_round_loop(target: Any, drafter: GpuDrafter, prompt: list[int], max_new_tokens: int, vocab: int,
                     cfg: SamplingConfig, st: SpecStats) -> None:
    """The start of a speculative run (chains here, trees in cuda_tree.py): the shared vocabulary and the sampling
    settings on both sides, then the prompt into the target's cache and the drafter, timed as the prefill."""
    target.limit_vocab(vocab)
    _set_sampling(target, cfg, 0)
    drafter.prepare(target, vocab, cfg)
    with st.timer("prefill"):
        drafter.prefill_target(target, prompt)
        drafter.prefill(prompt, max_new_tokens, vocab)
        target.stream.synchronize()


def capture_speculative_graphs(target: Any, drafter: Any, prompt_ids: Sequence[int], gamma: int,
                               cfg: SamplingConfig | None = None, vocab_size: int | None = None) -> None:
    """Capture every graph a speculative run of this gamma (and the drafter's lookup_steps) can replay, so that
    none is captured inside a timed run: a short run of each length 1..gamma + 1 (its one round verifies
    0..gamma drafts: a run's last rounds draft fewer) and the draft decoder's first steps of 2..gamma - steps
    + 2 tokens (after a round that accepted its tokens and looked-up ones; 2 without lookup). A verify graph's capture costs milliseconds: in a
    128-token run that is a large share of the time. Leaves both decoders' caches to be refilled (the next
    run prefills anew)."""
    drafter = as_gpu_drafter(drafter)
    for m in range(1, gamma + 2):
        speculative_generate_cuda(target, drafter, prompt_ids, m, cfg, gamma=gamma, vocab_size=vocab_size)
    drafter.capture(target, gamma)
    target.stream.synchronize()


def speculative_generate_cuda(target: Any, drafter: Any, prompt_ids: Sequence[int], max_new_tokens: int,
                              cfg: SamplingConfig | None = None, stop_ids: Iterable[int] | None = None,
                              gamma: int = 4, adaptive_gamma: bool = False, vocab_size: int | None = None,
                              on_tokens: TokenCallback | None = None) -> GenerationResult:
    """Speculative generation with a CudaDecoder target and a GpuDrafter (a bare draft CudaDecoder or host
    drafter is wrapped by as_gpu_drafter). Output follows the target exactly (module docstring).
    vocab_size: candidate tokens are the first vocab_size logits (default: the shared vocabulary, the
    smaller of the two decoders' logit counts; checkpoints often pad theirs differently). A DecoderDrafter's
    propose_vocab limits its proposals to that many first token ids (its LM head computes that slice; the
    target still chooses among all of them); its lookup_steps: it drafts that many tokens a round and prompt
    lookup continues them up to gamma inside the verify graph (--draft-extend; kernels/lookup.cu:
    NGramDrafter's rule over the context and those drafts, copying on where NGramDrafter would propose fewer,
    so every round verifies gamma drafts)."""
    cfg = cfg or SamplingConfig()
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma (draft length) must be an integer >= 1, got {gamma!r}")
    if adaptive_gamma not in (False, True, "cost"):
        raise ValueError(f"adaptive_gamma {adaptive_gamma!r}: the CUDA-graph engine takes False, True or 'cost'")
    if gamma > target.max_tokens - 1:
        raise ValueError(f"gamma must be at most {target.max_tokens - 1} (the target decoder's max_tokens - 1)")
    # "cost": each round drafts 1..gamma by the measured acceptance and the rounds' GPU times (budget.py; at least one
    # draft: the drafters keep their caches by drafting every round, and a verify row costs little here)
    budget = CostBudget(gamma, least=1) if adaptive_gamma == "cost" else None
    limit = max(gamma, min(target.max_tokens - 1, MAX_ADAPTIVE_GAMMA)) if adaptive_gamma is True else gamma  # most drafts
    prompt = [int(t) for t in prompt_ids]
    drafter = as_gpu_drafter(drafter)
    draft = drafter.device  # the draft decoder whose drafts and q rows the verify graph reads (None: host)
    steps = drafter.lookup_steps  # --draft-extend: the drafter's tokens a round (prompt lookup continues them)
    select = getattr(drafter, "lookup_first", 0) if cfg.greedy else 0  # --draft-lookup: greedy rounds only
    _check(target, prompt, max_new_tokens, limit + 1)
    drafter.check(target, prompt, max_new_tokens, limit)
    stops = set(int(s) for s in (stop_ids or ()))
    vocab = min(target.V, draft.V if draft is not None else target.V, int(vocab_size or target.V))
    cp, stream = target.cp, target.stream
    st = SpecStats()
    t0 = time.perf_counter()
    start_round_loop(target, drafter, prompt, max_new_tokens, vocab, cfg, st)
    if steps or select:  # the context prompt lookup searches (kernels/lookup.cu), grown on the device each round
        with stream:
            target.context[:len(prompt)].set(np.asarray(prompt, np.int64), stream=stream)
            target.context_len.set(np.asarray([len(prompt)], np.int32), stream=stream)
    events = [cp.cuda.Event() for _ in range(3)]
    out: list[int] = []
    g_now, first_T, done = gamma, 1, False
    while not done:
        if budget is not None:
            g_now = budget.choose(st.position_accepted, st.position_judged)
        g = min(g_now, max_new_tokens - len(out) - 1)  # a round emits at most g + 1 tokens
        events[0].record(stream)
        g, gq = drafter.draft(target, g, first_T, cfg)  # gq: the drafter's own tokens of the round
        if draft is not None:
            st.draft_forwards += max(gq, 0)
        events[1].record(stream)
        _verify(target, draft, g, gq, lookup=bool(steps), select=select)
        events[2].record(stream)
        res = target.spec_out[:g + 2].get(stream=stream)  # waits for the round
        t_draft = cp.cuda.get_elapsed_time(events[0], events[1]) / 1e3  # GPU time (ms -> s)
        t_verify = cp.cuda.get_elapsed_time(events[1], events[2]) / 1e3
        st.timer.add("draft", t_draft)
        st.timer.add("verify", t_verify)
        n = int(res[0])
        n_emit, done = emit([int(t) for t in res[1:n + 2]], out, max_new_tokens, stops)
        from_drafts = min(n_emit, n)
        st.record_round(g, n, from_drafts, n_emit - from_drafts)
        drafter.emitted(out[len(out) - n_emit:])
        if on_tokens is not None:
            on_tokens(out[len(out) - n_emit:])
        first_T = drafter.next_first_T(n, gq)  # a draft decoder feeds [d_gq, accepted lookups, next] or [next]
        if budget is not None:
            budget.record(g, gq if draft is not None else 0, t_draft, t_verify, n_emit)
        elif adaptive_gamma:
            g_now = min(next_gamma(g_now, g, n), limit)  # next_gamma stays within 1..MAX_ADAPTIVE_GAMMA
    stats = st.as_dict(time.perf_counter() - t0)
    stats["gamma"] = gamma
    stats["adaptive_gamma"] = adaptive_gamma
    if budget is not None:
        stats["draft_choices"] = {g: budget.choices.count(g) for g in sorted(set(budget.choices))}
    return GenerationResult(tokens=out, stop_reason="stop" if out and out[-1] in stops else "length", stats=stats)
