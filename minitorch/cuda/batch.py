"""Batched decoding on the GPU: many sequences at once over one CudaDecoder's weights (continuous batching's backend).

A decode step at batch 1 reads all the target's weights for one token (the 1.5B: 3.1 GB a step, bandwidth-bound);
`BatchDecoder` runs one step for up to `slots` sequences, so the same read serves them all. It implements the
SlotBackend protocol of minitorch/generation/batch.py (check / admit / step / release), whose scheduler keeps the
slots full: a finished sequence's slot is refilled from the waiting prompts before the next step.

KV cache: one region per slot, (slots, Hkv, max_len, D) a layer, allocated once. A slot's region is overwritten by
the next sequence admitted to it (positions 0.. are rewritten before any step reads them: attention reads a token's
own sequence up to its own position). Per-slot regions rather than pages: the writer's sequences have similar
lengths and a bounded max_len, so paging would buy little memory for a block table in every attention read; the
cost is max_len positions reserved a slot (the constructor checks they fit in free memory).

A step is "ragged": token t of a step carries its own sequence (tslot[t]) and position (tpos[t]). The decode step
is the case of one token a slot (tslot = 0..slots-1, tpos = each slot's position, both on the device, so the step is
captured once as a CUDA graph and replayed); admission prefills the new prompts together in steps of up to
`prefill_tokens` tokens (several prompts in one step), eagerly, and computes logits only for each prompt's last
token. The stages are CudaDecoder's, with batched kernels (kernels/gemv.cu gemvtcb*, attention.cu attn_rows_*):

    embed -> per layer [QKV product (rope, each token's key / value into its own slot), attention (each token over
    its own slot up to its position), O product added into the residual, RMSNorm, gate/up product (SwiGLU), down
    product added into the residual, RMSNorm] -> LM head -> argmax / per-row sampling -> batch_advance

Exactness: every kernel computes a token's values in an order that does not depend on the other tokens of the step
or on their number (the tensor-core GEMV of CudaDecoder(gemv="tc") in tiles of 16 tokens, the decode attention's
fixed 32-key splits, the resnorm epilogue's row function), so a sequence's greedy output in a batch is its batch-1
output bit for bit: equal to a CudaDecoder(gemv="tc") that prefills in chunks of at most 16 tokens (the exact
prefill) and decodes one token a step, and rows never mix (tests/test_cuda_batch.py, passed on an H200). Sampling
draws row r's token with its own seed and counter (kernels/sampling.cu sample_rows_f32), the draw a batch-1 decode
with that seed makes (the same file's sampled test, passed on the H200 too: docs/results/h200_batch_decoding).
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .launch import (ATT_MIN_SLOTS, ATT_RMAX, ATT_SLOT_BLOCKS, SAMPLE_CLUSTER, SAMPLE_THREADS, WIDE_ROWS, argmax_plan,
                     cluster_supported, resnorm_rows, tensor_cores_supported)
from .pdl import PdlLauncher
from .runtime import get_cupy, kernels

TILE = 16  # tokens a tile of the batched GEMV (gemvtcb*)
PREFILL_TOKENS = 512  # tokens an admission step holds at most (prompts share steps)
MULTI_TILES = 4  # tiles a block of the multi-tile product (kernels/gemv.cu gemvtcm*: 64 tokens, 16 weight rows)
MEMORY_SHARE = 0.9  # of the free GPU memory a BatchDecoder may take


class BatchDecoder:
    """`slots` sequences decoded together on a CudaDecoder's (dec, cuda/decoder.py) weights (shared, not copied): the SlotBackend of
    minitorch/generation/batch.py. max_len: cache positions a slot holds (its prompt plus its new tokens);
    vocab_size: candidate tokens are the first vocab_size logits; prefill_tokens: tokens an admission step holds;
    multi_tile: steps of more than 16 tokens run gemvtcm (4 tiles a block share each weight load) instead of gemvtcb
    (a block a tile): the same bits."""

    def __init__(self, dec: Any, slots: int, max_len: int, vocab_size: Optional[int] = None,
                 prefill_tokens: int = PREFILL_TOKENS, pdl: Optional[bool] = None, multi_tile: bool = True) -> None:
        if not isinstance(slots, int) or slots < 1:
            raise ValueError(f"a batch holds at least 1 sequence, got {slots!r}")
        limit = int(getattr(dec.cfg, "max_position_embeddings", 0) or max_len)
        if not 2 <= max_len <= limit:
            raise ValueError(f"max_len {max_len} outside 2..{limit} (the model's context)")
        if dec.D not in (64, 128):
            raise ValueError(f"batched decoding supports head sizes 64 and 128, not {dec.D}")
        if not tensor_cores_supported():
            raise ValueError("batched decoding needs a GPU of compute capability >= 8.0 (tensor-core GEMV)")
        self.dec, self.cp = dec, get_cupy()
        self.multi_tile = bool(multi_tile)
        self.slots, self.max_len = slots, int(max_len)
        self.nv = min(dec.V, int(vocab_size or dec.V))
        self.prefill_tokens = max(1, int(prefill_tokens))
        self.rows = max(slots, self.prefill_tokens)  # activation rows: a decode step or an admission step
        self.kb = 32 * max(1, math.ceil(self.max_len / (32 * 1024)))  # CudaDecoder's decode split at this length
        self.nsplit = math.ceil(self.max_len / self.kb)
        self._check_memory()
        self._alloc()
        self.k = PdlLauncher(kernels(), pdl=cluster_supported() if pdl is None else bool(pdl))
        self.sample_cluster = SAMPLE_CLUSTER if cluster_supported() else 1
        self.stream = self.cp.cuda.Stream(non_blocking=True)
        self.graphs: Dict[Any, Any] = {}
        self.occupied: Dict[int, bool] = {}  # slot -> whether it samples (else greedy)
        self._host = np.frombuffer(self.cp.cuda.alloc_pinned_memory(8 * slots), np.int64, slots)

    # ------------------------------------------------------------------ setup
    def kv_bytes(self) -> int:
        """Bytes of the slots' KV caches (all layers)."""
        d = self.dec
        return d.L * 2 * self.slots * d.Hkv * self.max_len * d.D * 2

    def _check_memory(self) -> None:
        d, R = self.dec, self.rows
        per_row = 4 * d.H + 2 * d.H + 4 * d.Hq * d.D + 2 * d.I + 4 * d.Hq * self.nsplit * (d.D + 2)
        need = self.kv_bytes() + R * per_row + self.slots * (8 * d.V + 2 * d.H + 64)
        free = self.cp.cuda.runtime.memGetInfo()[0]
        if need > MEMORY_SHARE * free:
            raise ValueError(f"a batch of {self.slots} sequences x {self.max_len} positions needs "
                             f"{need / 2 ** 30:.1f} GiB of GPU memory, {free / 2 ** 30:.1f} GiB free: "
                             "lower --batch or --max-len")

    def _alloc(self) -> None:
        cp, d, S, R = self.cp, self.dec, self.slots, self.rows
        u16, i32, i64, f32 = cp.uint16, cp.int32, cp.int64, cp.float32
        self.kc = [cp.zeros((S, d.Hkv, self.max_len, d.D), u16) for _ in range(d.L)]
        self.vc = [cp.zeros((S, d.Hkv, self.max_len, d.D), u16) for _ in range(d.L)]
        # per slot (the decode step's rows): input token, position, activity, sampler state and settings
        self.tokens, self.pos, self.active = cp.zeros(S, i64), cp.zeros(S, i32), cp.zeros(S, i32)
        self.slot_ids = cp.arange(S, dtype=i32)
        self.rng = cp.zeros((S, 2), cp.uint64)
        self.inv_temp, self.top_k, self.top_p = cp.zeros(S, f32), cp.zeros(S, i32), cp.ones(S, f32)
        # an admission step's tokens, positions, slots; the admitted prompts' last rows and their settings
        P = self.prefill_tokens
        self.ptok, self.ppos, self.pslot = cp.zeros(P, i64), cp.zeros(P, i32), cp.zeros(P, i32)
        self.hx = cp.zeros((S, d.H), u16)
        self.a_rng = cp.zeros((S, 2), cp.uint64)
        self.a_inv_temp, self.a_top_k, self.a_top_p = cp.zeros(S, f32), cp.zeros(S, i32), cp.ones(S, f32)
        self.a_ids = cp.zeros(S, i64)
        # activations of up to R tokens
        self.resid = cp.zeros((R, d.H), f32)
        self.xn = cp.zeros((R, d.H), u16)
        self.q = cp.zeros((R, d.Hq, d.D), u16)
        self.attn_out = cp.zeros((R, d.Hq * d.D), u16)
        self.act = cp.zeros((R, d.I), u16)
        ws = R * d.Hq * self.nsplit
        self.ws_m, self.ws_l, self.ws_acc = cp.zeros(ws, f32), cp.zeros(ws, f32), cp.zeros(ws * d.D, f32)
        # the LM head's rows (one a slot), the token choice
        self.logits = cp.zeros(S * d.V, f32)
        self.probs = cp.zeros(S * d.V, f32)
        self.next_ids = cp.zeros(S, i64)
        nch = argmax_plan(d.V)[0]
        self.am_v, self.am_i = cp.zeros(S * nch, f32), cp.zeros(S * nch, i32)

    # ------------------------------------------------------------------ stages
    def _product(self, x: Any, w: Any, T: int, N: int, K: int, mode: str = "", yb: Any = None, yf: Any = None,
                 resid: Any = None) -> None:
        """kernels/gemv.cu gemvtcb[w]{mode}: T tokens of x (T, K) times w (N, K)^T into yb / yf, added into resid,
        or (mode "_gusilu") the SwiGLU product of interleaved gate/up rows into yb (T, N / 2)."""
        z, i32 = np.uint64(0), np.int32
        name, grid = self._kernel(mode, T, N)
        args = (w, x, z, np.float32(self.dec.eps), z if yb is None else yb, z if yf is None else yf,
                z if resid is None else resid, i32(N), i32(K), i32(T), i32(K))
        if mode == "_gusilu":
            args = args + (self.dec.counter,)
        self.k.launch(name, grid, (256,), args)

    def _kernel(self, mode: str, T: int, N: int) -> Tuple[str, Tuple[int, int]]:
        """(name, grid) of the batched product of T tokens and N output rows: gemvtcm (MULTI_TILES tiles a block,
        16 rows) for steps of more than one tile when multi_tile, else gemvtcb[w] (_wide). The same bits."""
        if self.multi_tile and T > TILE:
            return f"gemvtcm{mode}_bf16", (math.ceil(T / (TILE * MULTI_TILES)), math.ceil(N / 16))
        wide = _wide(N, T)
        return f"gemvtcb{'w' if wide else ''}{mode}_bf16", (math.ceil(T / TILE), math.ceil(N / (16 if wide else 8)))

    def _layers(self, T: int, tok: Any, tpos: Any, tslot: Any, preload: bool) -> None:
        """Every layer over T tokens: token t is tok[t] of sequence tslot[t] at position tpos[t]. Leaves xn rows
        0..T-1 = the final norm of each token's hidden state (the LM head's input)."""
        d, k, i32, i64, f32 = self.dec, self.k, np.int32, np.int64, np.float32
        H, D, Hq, Hkv, ML = d.H, d.D, d.Hq, d.Hkv, self.max_len
        H3 = Hq + 2 * Hkv
        k.launch("embedding_bf16_f32", (T,), (256,), (d.embed, tok, self.resid, i32(d.V), i32(H)))
        # the first layer's norm: CudaDecoder's add_rmsnorm (same block size, so the same bits); the others come
        # from gemv_resnorm_rows after each residual add
        k.launch("add_rmsnorm_bf16", (T,), (min(1024, 32 * math.ceil(H / 128)),),
                 (self.resid, np.uint64(0), d.layers[0]["ln1"], self.xn, i32(H), f32(d.eps)))
        G = Hq // Hkv
        att_slots = min(self.nsplit, max(ATT_MIN_SLOTS, math.ceil(ATT_SLOT_BLOCKS / (Hkv * T))))
        for li, lw in enumerate(d.layers):
            kc, vc = self.kc[li], self.vc[li]
            bias = lw["qkv_bias"] if lw["qkv_bias"] is not None else np.uint64(0)
            N3 = H3 * D
            name, grid = self._kernel("_qkvrope", T, N3)
            k.launch(name, grid, (256,), (lw["qkv"], self.xn, i32(N3), i32(H), i32(T), bias, self.q, kc, vc, tpos, i32(Hq),
                              i32(Hkv), i32(D), i32(ML), f32(d.theta), tslot, i64(Hkv * ML * D)))
            k.launch(f"attn_rows_partial_bf16_d{D}", (att_slots, T * Hkv, math.ceil(G / ATT_RMAX)), (128,),
                     (self.q, kc, vc, self.ws_m, self.ws_l, self.ws_acc, tpos, tslot, i32(1 if preload else 0),
                      i64(Hq * D), i64(D), i64(Hkv * ML * D), i64(ML * D), i64(D), i32(Hq), i32(Hkv), i32(ML),
                      i32(self.kb), f32(D ** -0.5), i32(self.nsplit)))
            k.launch("attn_rows_combine_bf16", (T * Hq,), (32 * math.ceil(D / 32),),
                     (self.ws_m, self.ws_l, self.ws_acc, self.attn_out, i32(Hq), i32(D), i32(self.nsplit), tpos,
                      i32(ML), i32(self.kb)))
            self._product(self.attn_out, lw["o"], T, H, Hq * D, resid=self.resid)
            self._resnorm(T, lw["ln2"])
            self._product(self.xn, lw["gate_up"], T, 2 * d.I, H, mode="_gusilu", yb=self.act)
            self._product(self.act, lw["down"], T, H, d.I, resid=self.resid)
            self._resnorm(T, d.final_norm if li + 1 == d.L else d.layers[li + 1]["ln1"])

    def _resnorm(self, T: int, w: Any) -> None:
        """xn = RMSNorm(resid) * w for T rows (launch.resnorm_rows: the resnorm epilogue's row function)."""
        resnorm_rows(self.k, self.resid, w, self.xn, T, self.dec.H, self.dec.eps)

    def _choose(self, x: Any, R: int, out: Any, params: Optional[Tuple[Any, Any, Any, Any]]) -> None:
        """The LM head over x's rows 0..R-1, then out[r] = argmax, or a draw with row r's settings and generator
        (params: inv_temp, top_k, top_p, rng arrays; None: every row greedy)."""
        d, k, i32 = self.dec, self.k, np.int32
        self._product(x, d.lm_head, R, self.nv, d.H, yf=self.logits)
        nch, chunk = argmax_plan(self.nv)
        k.launch("argmax_partial_f32", (nch, R), (256,), (self.logits, self.am_v, self.am_i, i32(self.nv), i32(chunk)))
        k.launch("argmax_final", (R,), (128,), (self.am_v, self.am_i, out, i32(nch)))
        if params is not None:
            C = self.sample_cluster
            inv_temp, top_k, top_p, rng = params
            k.launch("sample_rows_f32", (C, R), (SAMPLE_THREADS,),
                     (self.logits, np.int64(self.nv), self.probs, np.int64(self.nv), i32(self.nv), inv_temp, top_k,
                      top_p, out, rng), cluster=(C, 1, 1) if C > 1 else None)

    def _decode_step(self, sampled: bool, advance: bool) -> None:
        S = self.slots
        self._layers(S, self.tokens, self.pos, self.slot_ids, preload=True)
        params = (self.inv_temp, self.top_k, self.top_p, self.rng) if sampled else None
        self._choose(self.xn, S, self.next_ids, params)
        if advance:
            self.k.launch("batch_advance", (math.ceil(S / 128),), (128,),
                          (self.pos, self.tokens, self.next_ids, self.active, np.int32(S), self.rng))

    # ------------------------------------------------------------------ the SlotBackend protocol
    def check(self, prompt: Sequence[int], max_new_tokens: int) -> None:
        """One ValueError line for a request a slot cannot hold."""
        if len(prompt) == 0:
            raise ValueError("empty prompt: a request needs at least one token")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if len(prompt) + max_new_tokens > self.max_len:
            raise ValueError(f"prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the batch's "
                             f"{self.max_len} cache positions a sequence (--max-len)")
        bad = [t for t in prompt if not 0 <= int(t) < self.dec.V]
        if bad:
            raise ValueError(f"token id {bad[0]} outside the model's vocabulary of {self.dec.V}")

    def admit(self, entries: Sequence[Tuple[int, Sequence[int], Any]]) -> List[int]:
        """Cache each (slot, prompt, sampling) entry's prompt in its slot (prompts share prefill steps) and return
        each entry's first new token; the slot then decodes from it at the next step."""
        if not entries:
            return []
        cp, S = self.cp, self.slots
        seen = set()
        for slot, prompt, cfg in entries:
            if not 0 <= slot < S or slot in self.occupied or slot in seen:
                raise ValueError(f"slot {slot} is not a free slot of this batch ({S} slots)")
            seen.add(slot)
            self.check(prompt, 1)
        m = len(entries)
        settings = [_row_settings(cfg) for _, _, cfg in entries]
        slots = np.array([e[0] for e in entries], np.int32)
        flat_tok = np.concatenate([np.asarray(p, np.int64) for _, p, _ in entries])
        flat_pos = np.concatenate([np.arange(len(p), dtype=np.int32) for _, p, _ in entries])
        flat_slot = np.concatenate([np.full(len(p), s, np.int32) for s, p, _ in entries])
        last = np.cumsum([len(p) for _, p, _ in entries]) - 1  # each prompt's last token in the flat order
        with self.stream:
            P = self.prefill_tokens
            for s0 in range(0, len(flat_tok), P):
                n = min(P, len(flat_tok) - s0)
                self.ptok[:n].set(flat_tok[s0:s0 + n], stream=self.stream)
                self.ppos[:n].set(flat_pos[s0:s0 + n], stream=self.stream)
                self.pslot[:n].set(flat_slot[s0:s0 + n], stream=self.stream)
                self._layers(n, self.ptok, self.ppos, self.pslot, preload=False)
                ends = [j for j in range(m) if s0 <= last[j] < s0 + n]
                if ends:  # the final-norm rows of the prompts that end in this step
                    self.hx[cp.asarray(np.array(ends, np.int64))] = self.xn[cp.asarray(last[ends] - s0)]
            sampled = any(t > 0 for t, _, _, _ in settings)
            if sampled:
                self.a_inv_temp[:m].set(np.array([s[0] for s in settings], np.float32), stream=self.stream)
                self.a_top_k[:m].set(np.array([s[1] for s in settings], np.int32), stream=self.stream)
                self.a_top_p[:m].set(np.array([s[2] for s in settings], np.float32), stream=self.stream)
                self.a_rng[:m].set(np.array([[s[3], 0] for s in settings], np.uint64), stream=self.stream)
            self._choose(self.hx, m, self.a_ids,
                         (self.a_inv_temp, self.a_top_k, self.a_top_p, self.a_rng) if sampled else None)
            first = self.a_ids[:m].get(stream=self.stream)
            self._arm(slots, first, np.array([len(p) for _, p, _ in entries], np.int32), settings)
        self.stream.synchronize()
        for (slot, _, _), s in zip(entries, settings):
            self.occupied[int(slot)] = s[0] > 0
        return [int(t) for t in first]

    def _arm(self, slots: np.ndarray, first: np.ndarray, lens: np.ndarray, settings: List[Tuple]) -> None:
        """The admitted slots' state for the decode steps: input = the first new token, at position len(prompt);
        active; the sampling settings; the generator's counter past the first draw."""
        cp = self.cp
        idx = cp.asarray(slots)
        self.tokens[idx] = cp.asarray(first)
        self.pos[idx] = cp.asarray(lens)
        self.active[idx] = 1
        self.inv_temp[idx] = cp.asarray(np.array([s[0] for s in settings], np.float32))
        self.top_k[idx] = cp.asarray(np.array([s[1] for s in settings], np.int32))
        self.top_p[idx] = cp.asarray(np.array([s[2] for s in settings], np.float32))
        self.rng[idx] = cp.asarray(np.array([[s[3], 1] for s in settings], np.uint64))

    def step(self) -> List[int]:
        """One decode step of every occupied slot; returns the next token of every slot (free slots: meaningless)."""
        sampled = any(self.occupied.values())  # the decode graph runs the sampler while a slot samples
        key = ("decode", sampled)
        g = self.graphs.get(key)
        with self.stream:
            if g is None:  # capture: one eager step without the advance first (loads the modules; it writes the
                self._decode_step(sampled, advance=False)  # cache entries the real step rewrites identically)
                self.stream.synchronize()
                self.stream.begin_capture()
                try:
                    self._decode_step(sampled, advance=True)
                finally:
                    g = self.graphs[key] = self.stream.end_capture()
            g.launch(self.stream)
            self.cp.cuda.runtime.memcpyAsync(self._host.ctypes.data, self.next_ids.data.ptr, 8 * self.slots,
                                             self.cp.cuda.runtime.memcpyDeviceToHost, self.stream.ptr)
        self.stream.synchronize()
        return [int(t) for t in self._host]

    def release(self, slot: int) -> None:
        """The slot's sequence is finished: the slot stops advancing until an admit fills it."""
        if self.occupied.pop(int(slot), None) is None:
            raise ValueError(f"slot {slot} holds no sequence")
        with self.stream:
            self.active[int(slot):int(slot) + 1] = 0


def _wide(N: int, T: int) -> bool:
    """Whether a product runs gemvtcbw (16 weight rows a block) rather than gemvtcb (8): for many output rows, as
    CudaDecoder's "tc" does, and for steps of several tiles, where every block reads its tokens' inputs again
    (through L2) and 16 rows a block halve those reads for the same weight bytes. The same bits either way."""
    return N > WIDE_ROWS or T > TILE


def _row_settings(cfg: Any) -> Tuple[float, int, float, int]:
    """(1 / temperature or 0 for greedy, top_k, top_p, seed) of a SamplingConfig, the seed as generate_cuda sets it
    for the target alone (generation/cuda.py _set_sampling, stream 0)."""
    t = float(getattr(cfg, "temperature", 0.0) or 0.0)
    seed = int(getattr(cfg, "seed", 0) or 0) & (2 ** 63 - 1)
    return (1.0 / t if t > 0 else 0.0, int(getattr(cfg, "top_k", 0) or 0), float(getattr(cfg, "top_p", 1.0) or 1.0),
            seed)
