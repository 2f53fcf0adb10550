"""Graph-captured Qwen2 decoding on the GPU: the fast path behind `project/bench/throughput.py`.

`CudaDecoder` holds a Qwen2-architecture model's weights on the device in bf16 (q/k/v and gate/up
projections concatenated so each is one GEMM), a preallocated KV cache, and every activation buffer.
One step over T tokens is: embedding -> per layer [add+RMSNorm, QKV GEMM, bias+rope+KV append,
split attention + combine, O GEMM, add+RMSNorm, gate/up GEMM, SiLU-mul, down GEMM] -> final norm ->
LM head GEMM -> device argmax. For decode / verify steps the products run in our bf16 GEMV kernel
(kernels/gemv.cu): the gate/up weight rows are interleaved (gate j, up j) so the gate/up GEMV writes
the SwiGLU product itself (silu="gateup", default; "down" keeps the older SwiGLU-in-the-down-
projection variant), the O / down projections add straight into the fp32 residual stream and their
last block computes the next RMSNorm (norm_epilogue, default; no separate norm launches), except that
for hidden sizes <= 2048 the QKV GEMV normalises its own input (qkv_norm="auto"); fuse_norm makes
every such GEMV normalise its input (slower on the H200, see kernels/NOTES.md). Wide one-token
products with short rows run 8 output rows a block (rows_big). Prefill uses cuBLAS and the separate
kernels.

Exactness: with gemv="ours" (or "tc", the tensor-core GEMV) every kernel of a step computes each token's values in an order that
does not depend on how many tokens the step holds (kernels/gemv.cu, attention.cu), so a verify step
reproduces the decode steps' logits bit for bit and greedy speculative output equals greedy
autoregressive output by construction. The default "ours1" verifies with cuBLAS (tensor cores, a
different summation order): verify steps are ~3x cheaper, but a near-tie between the top two logits
can resolve differently than in a decode step. The cache position lives in device memory, so a step captured once per
T as a CUDA graph replays at any position; the only host synchronisation is reading token ids back.
cuBLAS is called through ctypes (capture-safe); everything else is kernels/*.cu.

The config is any object with the Hugging Face Qwen2 field names (hidden_size, num_hidden_layers,
num_attention_heads, num_key_value_heads, intermediate_size, vocab_size, rope_theta, rms_norm_eps,
tie_word_embeddings); weights are a dict keyed by checkpoint names (model.layers.0.self_attn.q_proj.weight,
...), as float32/bf16 numpy or CuPy arrays.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

import numpy as np

from .blas import CUDA_R_16BF, CUDA_R_32F, cublas
from .launch import (ATT_CLUSTER_MAX, ATT_RMAX, SAMPLE_CLUSTER, SAMPLE_THREADS, argmax_plan, attn_partial_kernel,
                     cluster_supported, tensor_cores_supported)
from .pdl import PdlLauncher
from .runtime import get_cupy, kernels


ATT_SLOT_BLOCKS = 264  # attention partial blocks a step aims at (two per SM of an H200) ...
ATT_MIN_SLOTS = 32  # ... with at least this many split slots (long prefill steps have many row groups)
# kernels/gemv.cu's one- and two-token products on 8-bit rows (CudaDecoder(int8_weights=True)) by input / output
# mode: 4 output rows a block, or I8_BIG_ROWS for products of many rows (N > 8192, K <= 4096: gate/up, the LM head)
I8_MODES = ("", "_norm", "_gusilu", "_norm_gusilu", "_resnorm", "_qkvrope", "_norm_qkvrope")
I8_BIG_MODES = ("", "_norm", "_gusilu", "_norm_gusilu")
I8_BIG_ROWS = {1: 16, 2: 8}  # by tokens a step
ATT_STEP_ROWS = 16  # steps of at most this many tokens (decode, verify) share one attention split size
PT_THREADS = 512  # kernels/persistent.cu: threads a block, ...
PT_KS_MAX = 128  # ... keys per attention split at most, ...
PT_ROWS_MAX = 16  # ... query rows of one attention item (2 tokens x query heads a kv head) ...
PT_MAX_HEAD_DIM = 128  # ... and the largest head size
_NORMED = object()  # "xn already holds the normalised residual" (a resnorm GEMV's epilogue wrote it)


def _bf16_bits(cp: Any, arr: Any) -> Any:
    """float32 (numpy / CuPy) or already-bf16 uint16 -> contiguous CuPy uint16 bf16 bits."""
    if str(arr.dtype) == "uint16":
        return cp.ascontiguousarray(cp.asarray(arr))
    a = cp.asarray(arr, dtype=cp.float32)
    u = a.view(cp.uint32)
    return ((u + cp.uint32(0x7FFF) + ((u >> 16) & cp.uint32(1))) >> 16).astype(cp.uint16)


def quantize_rows_int8(xp: Any, w: Any) -> "tuple[Any, Any]":
    """Symmetric 8-bit codes of a float32 (N, K) matrix, one scale per row (numpy or CuPy as xp):
    codes (N, K) int8 in [-127, 127] and scales (N,) float32 with w ~= codes * scales[:, None], each
    element within half a scale step; an all-zero row gets scale 1 and zero codes."""
    amax = xp.abs(w).max(axis=1)
    scale = xp.where(amax > 0, amax / 127.0, 1.0).astype(xp.float32)
    codes = xp.clip(xp.rint(w / scale[:, None]), -127, 127).astype(xp.int8)
    return codes, scale


def int8_unsupported(cfg: Any) -> Optional[str]:
    """Why CudaDecoder(int8_weights=True) refuses a model of this config, or None: the 8-bit kernels read
    rows in chunks of 16 codes."""
    H, I, Hq = cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads
    D = getattr(cfg, "head_dim", None) or H // Hq
    if H % 16 or I % 16 or (Hq * D) % 16:
        return (f"int8_weights needs input sizes that are multiples of 16 (hidden {H}, intermediate {I}, "
                f"heads x head size {Hq * D})")
    return None


def random_weights(cfg: Any, seed: int = 0, std: float = 0.02) -> Dict[str, Any]:
    """Random bf16 device weights of cfg's real shapes (norm weights 1, biases small)."""
    cp = get_cupy()
    g = cp.random.default_rng(seed)
    H, I, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    D = getattr(cfg, "head_dim", None) or H // cfg.num_attention_heads
    Hq, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads

    def rnd(*shape: int) -> Any:
        return _bf16_bits(cp, g.standard_normal(shape, dtype=cp.float32) * std)

    w: Dict[str, Any] = {"model.embed_tokens.weight": rnd(V, H), "model.norm.weight": _bf16_bits(cp, cp.ones(H, cp.float32))}
    if not cfg.tie_word_embeddings:
        w["lm_head.weight"] = rnd(V, H)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = rnd(Hq * D, H)
        w[p + "self_attn.k_proj.weight"] = rnd(Hkv * D, H)
        w[p + "self_attn.v_proj.weight"] = rnd(Hkv * D, H)
        w[p + "self_attn.q_proj.bias"] = rnd(Hq * D)
        w[p + "self_attn.k_proj.bias"] = rnd(Hkv * D)
        w[p + "self_attn.v_proj.bias"] = rnd(Hkv * D)
        w[p + "self_attn.o_proj.weight"] = rnd(H, Hq * D)
        w[p + "mlp.gate_proj.weight"] = rnd(I, H)
        w[p + "mlp.up_proj.weight"] = rnd(I, H)
        w[p + "mlp.down_proj.weight"] = rnd(H, I)
        w[p + "input_layernorm.weight"] = _bf16_bits(cp, cp.ones(H, cp.float32))
        w[p + "post_attention_layernorm.weight"] = _bf16_bits(cp, cp.ones(H, cp.float32))
    return w


def weights_from_model(model: Any) -> Dict[str, Any]:
    """Checkpoint-named float32 numpy weights of a minitorch Qwen2ForCausalLM (any backend)."""
    return {name: np.asarray(p.value.to_numpy(), dtype=np.float32) for name, p in model.named_parameters()
            if p.value is not None}


class CudaDecoder:
    """A Qwen2 model resident on the GPU with a KV cache of max_len positions and CUDA-graph steps."""

    def __init__(self, cfg: Any, weights: Dict[str, Any], max_len: int, max_tokens: int = 128,
                 gemv: str = "ours1", fuse_norm: bool = False, pdl: Optional[bool] = None,
                 silu: str = "gateup", norm_epilogue: bool = True, qkv_rope: bool = True, rows1: int = 4,
                 rows_big: int = 8, attn: str = "split", qkv_norm: str = "auto",
                 attn_kb: Optional[int] = None, tc_wide: bool = True, persistent: bool = False,
                 int8_weights: bool = False, graph_prefill: bool = False) -> None:
        """gemv: which steps run their products in kernels/gemv.cu (SwiGLU and the residual add
        fused in): "ours1" one-token steps (default: verify steps then cost about one decode
        step, H200), "ours" steps of <= 16 tokens, "cublas" none; the others use cuBLAS and
        separate norm / SwiGLU kernels; "ours" makes verify == decode bit for bit (module doc).
        "ourstc" (a speculative draft's): one-token steps in our CUDA-core GEMV, steps of 2..16 tokens in the
        tensor-core one, the faster of the two at each size on the H200 (the 0.5B's two-token step: 0.752 ms in
        tc against 0.925 in "ours", round 10 call 4); the two sizes' numbers then differ in the last bits, which
        a draft's never reach the output, so not for a target.
        "tc": steps of <= 16 tokens in the tensor-core GEMV (gemvtc*: mma.m16n8k16, one kernel for
        decode and verify, so verify == decode bit for bit as with "ours", and a verify of <= 8 tokens
        costs about one decode step); needs compute capability >= 8.0, silu="gateup", no fuse_norm,
        and normalises in the previous projection's epilogue (qkv_norm "epilogue"). tc_wide: its
        products of more than 8192 outputs (gate/up, LM head) run 16 rows a block (gemvtc*w: two weight
        tiles per set of token loads); the same bits either way.
        fuse_norm: RMSNorm computed inside the GEMVs that read a normalised input (see qkv_norm).
        pdl: launch the step's kernels with programmatic dependent launch (minitorch/cuda/pdl.py);
        None (default) = on for compute capability >= 9.0 (H200: decode step 1.78 -> 1.63 ms at 1.5B).
        silu: "gateup" (default) = gate/up weight rows interleaved, our gate/up GEMV writes
        bf16(silu(gate) * up) in its epilogue (cuBLAS steps: gate_up_silu_il_bf16); "down" = the
        earlier layout [gate | up], SwiGLU recomputed by every block of the down GEMV (T=1 only).
        norm_epilogue: our O / down GEMVs that add into the residual stream also compute the next
        RMSNorm in their last block (no add_rmsnorm launch); ignored with fuse_norm.
        qkv_rope: q/k/v weight rows (and biases) permuted within each head to (0, D/2, 1, D/2+1, ...)
        so our QKV GEMV applies rope and writes q and the KV caches in its epilogue (no
        qkv_rope_append launch); cuBLAS steps use qkv_rope_append_il_bf16 on the permuted product.
        rows1: output rows a block for one-token products with N <= 8192 (q/k/v, o, down): 4 (default)
        or 2 (twice the blocks; slower on the H200).
        rows_big: output rows a block for one-token products with N > 8192 and K <= 2048 (the 1.5B
        gate/up and vocabulary projections): 8 (default; gemv1r8_*: twice the bytes in flight a block,
        1.5B decode step -2.8% on the H200) or 4. The same bits either way.
        attn: "split" = attn_partial + attn_combine (workspace in global memory); "cluster" = one
        kernel whose splits merge through distributed shared memory (sm_90; at most 16 splits of 32
        keys, so max_len <= 512); "auto" = cluster where the device and max_len allow it, else split.
        All three give identical bits.
        qkv_norm: "epilogue" = the down projection's last block writes the next layer's normalised
        input (norm_epilogue); "consumer" = the down projection only adds into the residual stream and
        the next QKV GEMV computes the RMSNorm itself (gemv*_norm_qkvrope_bf16: no ticket tail, but
        every block reads the fp32 row and the norm weight); "auto" (default) = consumer for
        hidden_size <= 2048 (H200: 1.5B step -1.5%, 7B step +1.2% with consumer, kernels/NOTES.md).
        fuse_norm makes every one of our GEMVs that reads a normalised input (QKV, gate/up, LM head)
        compute the norm itself.
        attn_kb: keys per attention split of steps of <= 16 tokens (a multiple of 32; default 32 up to
        32,768 cache positions, then the least multiple of 32 that keeps 1024 splits; longer prefill
        steps use larger splits). Any fixed value keeps verify == decode bit for bit. A step's attention
        costs what its visible splits cost, not max_len: the partial kernel's blocks loop over the
        splits holding visible keys and stop, and attn_combine merges only those (kernels/attention.cu).
        persistent: steps of 1 or 2 tokens run every layer in ONE cooperative kernel (kernels/persistent.cu:
        a block per multiprocessor, grid-wide barriers between a layer's phases), then the LM head and the
        token choice as usual. Meant for a speculative draft's latency-bound steps: its numbers differ from
        the other modes' in the last bits (fp32 activations, its own summation order), and a draft's never
        reach the output; deterministic run to run. On the H200 not yet faster than the separate kernels
        (0.5B step 0.956 vs 0.664 ms, docs/GPU_RESULTS.md round 9). Needs silu="gateup", qkv_rope, a head
        size that is a multiple of 8 and <= 128, Hq / Hkv <= 8.
        int8_weights: steps of one or two tokens (a speculative draft's) run every projection and the LM head
        on 8-bit copies of the weight rows, one scale a row (quantize_rows_int8; kernels/gemv.cu gemv{1,2}*_i8):
        half the bytes a step reads. For a speculative draft only: its numbers differ from the bf16 rows'
        (each row's sum by up to sum|x| * scale / 2), and a draft's numbers never reach the output. Steps of
        more tokens (prefill) keep the bf16 rows, which stay resident too. On the H200 (round 10, call 1) the
        0.5B one-token step takes 0.593 ms against 0.660 with bf16 rows, the two-token step (TMAX 2 kernels)
        0.878 against 0.925 (docs/GPU_RESULTS.md round 10); with gemv="ourstc" two-token steps use the
        tensor-core GEMV on the bf16 rows instead (0.752 ms).
        graph_prefill: generation fills the prompt's cache with fill_cache (chunks padded to max_tokens rows, one
        captured graph) instead of eager prefill steps (the CLI's default, --gpu-prefill)."""
        if rows1 not in (2, 4):
            raise ValueError(f"rows1 must be 2 or 4, got {rows1!r}")
        if rows_big not in (4, 8):
            raise ValueError(f"rows_big must be 4 or 8, got {rows_big!r}")
        if qkv_norm not in ("epilogue", "consumer", "auto"):
            raise ValueError(f"qkv_norm must be 'epilogue', 'consumer' or 'auto', got {qkv_norm!r}")
        self.qkv_norm = "consumer" if qkv_norm == "auto" and cfg.hidden_size <= 2048 else \
            "epilogue" if qkv_norm == "auto" else qkv_norm
        if attn not in ("split", "cluster", "auto"):
            raise ValueError(f"attn must be 'split', 'cluster' or 'auto', got {attn!r}")
        self.rows1 = rows1
        self.rows_big = rows_big
        if gemv not in ("ours", "ours1", "cublas", "tc", "ourstc"):
            raise ValueError(f"gemv must be 'ours', 'ours1', 'cublas', 'tc' or 'ourstc', got {gemv!r}")
        if gemv in ("tc", "ourstc"):  # the tensor-core GEMV takes bf16 inputs: no in-kernel norm or SwiGLU input
            if silu != "gateup" or fuse_norm or (gemv == "tc" and qkv_norm == "consumer"):
                raise ValueError(f"gemv={gemv!r} needs silu='gateup', fuse_norm=False" +
                                 (" and qkv_norm 'auto' or 'epilogue'" if gemv == "tc" else ""))
            if not tensor_cores_supported():
                raise ValueError(f"gemv={gemv!r} needs a GPU of compute capability >= 8.0 (mma.m16n8k16 bf16)")
            if gemv == "tc":
                self.qkv_norm = "epilogue"
        self.tc_wide = bool(tc_wide)
        if silu not in ("gateup", "down"):
            raise ValueError(f"silu must be 'gateup' or 'down', got {silu!r}")
        cp = self.cp = get_cupy()
        self.gemv = gemv
        self.fuse_norm = fuse_norm
        self.silu = silu
        self.norm_epilogue = bool(norm_epilogue) and not fuse_norm
        self.qkv_rope = bool(qkv_rope)
        self.cfg = cfg
        H, I, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
        Hq, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
        D = getattr(cfg, "head_dim", None) or H // Hq
        if D % 2 or D > 256 or Hq % Hkv:
            raise ValueError(f"unsupported attention shape: {Hq} heads of {D}, {Hkv} kv heads")
        self.H, self.I, self.V, self.Hq, self.Hkv, self.D = H, I, V, Hq, Hkv, D
        self.nv = V  # candidate tokens: the first nv logits (limit_vocab); logits rows have nv columns
        # as a speculative draft: propose among the first propose_vocab token ids only (None: the shared
        # vocabulary); minitorch/generation/cuda.py limits the LM head to them for the run
        self.propose_vocab: Optional[int] = None
        # as a speculative draft: its tokens a round, continued by prompt lookup up to gamma (None: no lookup;
        # minitorch/generation/cuda.py, --draft-extend)
        self.lookup_steps: Optional[int] = None
        self.L = cfg.num_hidden_layers
        self.max_len, self.max_tokens = max_len, max_tokens
        self.eps = float(cfg.rms_norm_eps)
        self.theta = float(cfg.rope_theta)
        get = lambda k: _bf16_bits(cp, weights[k])  # noqa: E731
        self.embed = get("model.embed_tokens.weight")
        self.lm_head = self.embed if cfg.tie_word_embeddings or "lm_head.weight" not in weights else get("lm_head.weight")
        self.final_norm = get("model.norm.weight")
        self.layers: List[Dict[str, Any]] = []
        for i in range(self.L):
            p = f"model.layers.{i}."
            qkv = cp.concatenate([get(p + f"self_attn.{n}_proj.weight") for n in "qkv"], axis=0)  # (H3*D, H)
            has_bias = (p + "self_attn.q_proj.bias") in weights
            bias = cp.concatenate([get(p + f"self_attn.{n}_proj.bias") for n in "qkv"]) if has_bias else None
            if self.qkv_rope:  # rows of each head: 0, D/2, 1, D/2 + 1, ... (rotation pairs adjacent)
                H3_ = Hq + 2 * Hkv
                qkv = cp.ascontiguousarray(qkv.reshape(H3_, 2, D // 2, H).transpose(0, 2, 1, 3).reshape(H3_ * D, H))
                if bias is not None:
                    bias = cp.ascontiguousarray(bias.reshape(H3_, 2, D // 2).transpose(0, 2, 1).reshape(-1))
            if silu == "gateup":  # rows gate 0, up 0, gate 1, up 1, ... (2I, H)
                gu = cp.stack([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")], axis=1).reshape(2 * I, H)
            else:  # [gate | up] (2I, H)
                gu = cp.concatenate([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")], axis=0)
            gu = cp.ascontiguousarray(gu)
            self.layers.append(dict(
                qkv=qkv, qkv_bias=bias, o=get(p + "self_attn.o_proj.weight"), gate_up=gu,
                down=get(p + "mlp.down_proj.weight"), ln1=get(p + "input_layernorm.weight"),
                ln2=get(p + "post_attention_layernorm.weight"),
                k=cp.zeros((Hkv, max_len, D), cp.uint16), v=cp.zeros((Hkv, max_len, D), cp.uint16)))
        T, H3 = max_tokens, Hq + 2 * Hkv
        self.tokens = cp.zeros(T, cp.int64)
        self.pos = cp.zeros(1, cp.int32)
        self.resid = cp.zeros((T, H), cp.float32)
        self.xn = cp.zeros((T, H), cp.uint16)
        self.qkv = cp.zeros((T, H3 * D), cp.uint16)
        self.q = cp.zeros((T, Hq, D), cp.uint16)
        self.attn_out = cp.zeros((T, Hq * D), cp.uint16)
        self.o = cp.zeros((T, H), cp.uint16)
        self.gu = cp.zeros((T, 2 * I), cp.uint16)
        self.act = cp.zeros((T, I), cp.uint16)
        self.down = cp.zeros((T, H), cp.uint16)
        self.logits = cp.zeros((T, V), cp.float32)
        self.next_ids = cp.zeros(T, cp.int64)
        self.history = cp.zeros(max_len + T, cp.int64)
        self.am_v = cp.zeros(T * argmax_plan(V)[0], cp.float32)
        self.am_i = cp.zeros(T * argmax_plan(V)[0], cp.int32)
        # keys per attention split of decode / verify steps (<= ATT_STEP_ROWS tokens): one 32-key chunk up
        # to 32k positions, at most 1024 splits beyond; longer (prefill) steps, which need not match them
        # bit for bit, use at most 256 larger splits (the workspace holds max_tokens rows of those)
        self.kb = int(attn_kb) if attn_kb is not None else 32 * max(1, math.ceil(max_len / (32 * 1024)))
        if self.kb < 32 or self.kb % 32:
            raise ValueError(f"attn_kb must be a positive multiple of 32, got {attn_kb!r}")
        self.nsplit = math.ceil(max_len / self.kb)
        self.kb_big = max(self.kb, 32 * max(1, math.ceil(max_len / (32 * 256))))
        self.nsplit_big = math.ceil(max_len / self.kb_big)
        fits = self.nsplit <= ATT_CLUSTER_MAX and cluster_supported()
        if attn == "cluster" and not fits:
            raise ValueError(f"attn='cluster' needs compute capability >= 9.0 and at most {ATT_CLUSTER_MAX} "
                             f"attention splits ({self.nsplit} for max_len {max_len}); use 'auto' or 'split'")
        self.attn = "cluster" if attn == "cluster" or (attn == "auto" and fits) else "split"
        kv = (max_len * D, D, 1)  # the caches: (Hkv, max_len, D) bf16, fresh (aligned) allocations
        self.attn_partial = attn_partial_kernel("bf16", D, kv, kv, 0, 0)
        ws_rows = Hq * max(min(T, ATT_STEP_ROWS) * self.nsplit, T * self.nsplit_big)
        self.ws_m = cp.zeros(ws_rows, cp.float32)
        self.ws_l = cp.zeros(ws_rows, cp.float32)
        self.ws_acc = cp.zeros(ws_rows * D, cp.float32)
        self.counter = cp.zeros(1, cp.uint32)  # grid-wide ticket of the resnorm GEMVs (0 between launches)
        # sampling (kernels/sampling.cu): None = greedy (argmax), else (1 / temperature, top_k, top_p);
        # rng = [seed, counter] on the device; probs = a ring of filtered probability rows (the draft's q
        # rows of a speculative round, or the target's p rows of a verify step)
        self.sampling: Optional[tuple] = None
        self.rng = cp.zeros(2, cp.uint64)
        self.sample_cluster = SAMPLE_CLUSTER if cluster_supported() else 1  # blocks that share one row
        self.probs = cp.zeros((T, V), cp.float32)  # a ring of max_tokens rows
        self.spec_out = cp.zeros(T + 2, cp.int64)  # a speculative round's [n, accepted drafts, next]
        # as a speculative target with --draft-extend: the run's tokens so far, for prompt lookup on the device
        # (kernels/lookup.cu; the prompt, then each round's emitted tokens, at most a round past max_len)
        self.context = cp.zeros(max_len + T + 2, cp.int64)
        self.context_len = cp.zeros(1, cp.int32)
        self.graph_refs: Dict[Any, Any] = {}  # objects whose device buffers a captured graph uses
        self.blas = cublas()
        if pdl is None:
            pdl = cluster_supported()  # PDL and clusters both arrive with compute capability 9.0
        self.pdl = bool(pdl)
        self.k = PdlLauncher(kernels(), pdl=self.pdl)
        if int8_weights and persistent:
            raise ValueError("int8_weights and persistent cannot be combined")
        self.persistent = bool(persistent)
        if self.persistent:
            self._persistent_setup()
        # int8_weights: 8-bit copies of the projection rows, keyed by the bf16 array's device pointer
        self.q8: Dict[int, "tuple[Any, Any]"] = {}
        if int8_weights:
            why = int8_unsupported(cfg)
            if why:
                raise ValueError(why)
            for w in [lw[n] for lw in self.layers for n in ("qkv", "o", "gate_up", "down")] + [self.lm_head]:
                if w.data.ptr in self.q8:
                    continue
                codes, scales = cp.empty(w.shape, cp.int8), cp.empty(w.shape[0], cp.float32)
                for r in range(0, w.shape[0], 16384):  # a slice at a time: float32 copies of big rows are large
                    f = (w[r:r + 16384].astype(cp.uint32) << 16).view(cp.float32)
                    codes[r:r + 16384], scales[r:r + 16384] = quantize_rows_int8(cp, f)
                self.q8[w.data.ptr] = (codes, scales)
        self.graph_prefill = bool(graph_prefill)
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.graphs: Dict[Any, Any] = {}

    @property
    def config(self) -> Any:
        """The model config (generation's request checks read config.max_position_embeddings)."""
        return self.cfg

    def _persistent_setup(self) -> None:
        """Check the shape and allocate what kernels/persistent.cu needs (module comment there)."""
        cp, H, I, Hq, Hkv, D = self.cp, self.H, self.I, self.Hq, self.Hkv, self.D
        problem = None
        if self.silu != "gateup" or not self.qkv_rope:
            problem = "silu='gateup' and qkv_rope=True (its weight layouts)"
        elif D % 8 or D > PT_MAX_HEAD_DIM or H % 8 or I % 8:
            problem = f"a head size that is a multiple of 8 and <= {PT_MAX_HEAD_DIM}, hidden and intermediate sizes multiples of 8"
        elif 2 * (Hq // Hkv) > PT_ROWS_MAX:
            problem = f"at most {PT_ROWS_MAX // 2} query heads a kv head"
        if problem:
            raise ValueError(f"persistent=True needs {problem}")
        self.pt_blocks = int(cp.cuda.Device().attributes["MultiProcessorCount"])
        self.pt_smax = math.ceil(self.max_len / 32) + 1  # attention splits hold >= 32 keys (kernels/persistent.cu)
        T = 2
        rows = T * Hq * self.pt_smax
        self.pt_q = cp.zeros((T, Hq, D), cp.float32)
        self.pt_ws_m = cp.zeros(rows, cp.float32)
        self.pt_ws_l = cp.zeros(rows, cp.float32)
        self.pt_ws_acc = cp.zeros(rows * D, cp.float32)
        self.pt_attn = cp.zeros((T, Hq * D), cp.float32)
        self.pt_act = cp.zeros((T, I), cp.float32)
        # barrier counter, generation, "a block gave up waiting"; from 8 on the -DPT_TIMING=1 marks
        self.pt_bar = cp.zeros(8 + 1 + 6 * self.L, cp.uint32)
        cols = ("qkv", "qkv_bias", "o", "gate_up", "down", "ln1", "ln2", "k", "v")
        self.pt_layers = cp.asarray(np.array([[0 if lw[c] is None else lw[c].data.ptr for c in cols]
                                              for lw in self.layers], np.uint64))
        G = Hq // Hkv
        attn_floats = T * G * D + T * G * PT_KS_MAX + PT_KS_MAX * D // 2
        self.pt_smem = 4 * max(T * max(H, Hq * D, I), attn_floats)

    def _persistent_layers(self, T: int) -> None:
        """Embedding and every layer of a 1- or 2-token step in one launch; xn[:T] = the final norm's output."""
        i32 = np.int32
        self.k.launch(f"persist{T}_bf16", (self.pt_blocks,), (PT_THREADS,),
                      (self.pt_layers, self.embed, self.tokens, self.final_norm, self.pos, self.resid, self.xn,
                       self.pt_q, self.pt_ws_m, self.pt_ws_l, self.pt_ws_acc, self.pt_attn, self.pt_act, self.pt_bar,
                       i32(self.L), i32(self.H), i32(self.Hq), i32(self.Hkv), i32(self.D), i32(self.I),
                       i32(self.max_len), i32(self.pt_smax), np.float32(self.eps), np.float32(self.theta)),
                      shared_mem=self.pt_smem, cooperative=True)

    def persistent_failed(self) -> bool:
        """Whether a persistent step's grid barrier ever gave up waiting (a grid that was not resident
        at once: its numbers are wrong). Synchronises the stream."""
        self.stream.synchronize()
        return bool(int(self.pt_bar[2].get())) if self.persistent else False

    # ------------------------------------------------------------------ one step (capturable)
    def _ours(self, M: int, K: int) -> bool:
        """Whether an M-token product runs in our GEMV (else cuBLAS)."""
        limit = {"ours": 16, "ours1": 1, "cublas": 0, "tc": 16, "ourstc": 16}[self.gemv]
        return M <= limit and K % 8 == 0

    def _tc(self, M: int) -> bool:
        """Whether an M-token product of ours runs in the tensor-core GEMV."""
        return self.gemv == "tc" or (self.gemv == "ourstc" and M > 1)

    def _kname(self, M: int, N: int, mode: str, K: int = 0) -> "tuple[str, int]":
        """(kernel name, output rows a block) of the kernels/gemv.cu instantiation for an M-token
        product of N outputs (rows of K) in input/output mode `mode` ("", "_resnorm", "_qkvrope", ...)."""
        if self._tc(M):  # one kernel for 1..8 tokens (decode and verify alike), one for 9..16
            if mode not in ("", "_gusilu", "_resnorm", "_qkvrope"):
                raise ValueError(f"no tensor-core GEMV for mode {mode!r}")
            wide = self.tc_wide and N > 8192
            return f"gemvtc{8 if M <= 8 else 16}{'w' if wide else ''}{mode}_bf16", 16 if wide else 8
        tm = 1 if M == 1 else 4 if M <= 4 else 5 if M == 5 else 8 if M <= 8 else 16
        if tm == 1 and self.rows1 == 2 and N <= 8192 and mode in ("", "_resnorm", "_qkvrope"):
            return f"gemv1r2{mode}_bf16", 2
        if tm == 1 and self.rows_big == 8 and N > 8192 and K <= 2048 and mode in ("", "_gusilu", "_norm",
                                                                                  "_norm_gusilu"):
            return f"gemv1r8{mode}_bf16", 8
        return f"gemv{tm}{mode}_bf16", (2 if tm == 16 else 4)

    def _gemv(self, x: Any, w: Any, M: int, N: int, K: int, yb: Any = None, yf: Any = None,
              resid: Any = None, mode: str = "", nw: Any = None) -> None:
        """kernels/gemv.cu; mode "" (x bf16), "_silu" (x = [gate | up]), "_norm" (x = fp32
        residual rows, normalised with weight nw inside the kernel), "_gusilu" (interleaved gate/up
        rows -> yb = SwiGLU product) or "_resnorm" (resid += x @ w^T, then yb = RMSNorm(resid) * nw)."""
        name, rows = self._kname(M, N, mode, K)
        z = np.uint64(0)
        q8 = self._q8(w, M, N, mode, K)
        if q8 is not None:
            name, rows, w = q8[0], q8[1], q8[2]
        args = (w, x, nw if nw is not None else z, np.float32(self.eps), yb if yb is not None else z,
                yf if yf is not None else z, resid if resid is not None else z, np.int32(N), np.int32(K),
                np.int32(M), np.int32(2 * K if mode == "_silu" else K))
        if q8 is not None:
            args = args + (self.counter, q8[3])
        elif mode in ("_gusilu", "_resnorm", "_norm_gusilu"):
            args = args + (self.counter,)
        self.k.launch(name, (math.ceil(N / rows),), (256,), args)

    def _q8(self, w: Any, M: int, N: int, mode: str, K: int) -> "Optional[tuple]":
        """(kernel, rows a block, codes, scales) of the 8-bit product of M = 1 or 2 tokens for weight w
        (int8_weights), or None: a step of more tokens or one for the tensor-core GEMV ("ourstc": faster at two
        tokens than 8-bit rows in the CUDA-core one), or a weight without 8-bit rows."""
        if M not in I8_BIG_ROWS or self._tc(M) or not self.q8 or w.data.ptr not in self.q8:
            return None
        if mode not in I8_MODES:  # an input mode without 8-bit kernels (_silu: silu="down")
            return None
        big = I8_BIG_ROWS[M] if N > 8192 and K <= 4096 and mode in I8_BIG_MODES else 0
        codes, scales = self.q8[w.data.ptr]
        return f"gemv{M}{f'r{big}' if big else ''}{mode}_i8", (big or 4), codes, scales

    def _gemm(self, x: Any, w: Any, y: Any, M: int, N: int, K: int, out_f32: bool = False) -> None:
        """y[M, N] = x[M, K] @ w[N, K]^T (bf16, or fp32 logits)."""
        if self._ours(M, K):
            self._gemv(x, w, M, N, K, yf=y if out_f32 else None, yb=None if out_f32 else y)
            return
        self.blas.linear(x.data.ptr, w.data.ptr, y.data.ptr, M, N, K, CUDA_R_16BF, CUDA_R_16BF,
                         CUDA_R_32F if out_f32 else CUDA_R_16BF)

    def _gemm_resid(self, x: Any, w: Any, tmp: Any, M: int, N: int, K: int, nw: Any = None) -> Optional[Any]:
        """Project and add into the fp32 residual stream; returns the bf16 delta still to be added
        (cuBLAS path: the next add+RMSNorm adds it), None (our GEMV added it already) or _NORMED
        (our GEMV added it and wrote xn = RMSNorm(resid) * nw as well: norm_epilogue)."""
        if self._ours(M, K):
            if nw is not None and self.norm_epilogue:
                self._gemv(x, w, M, N, K, yb=self.xn, resid=self.resid, mode="_resnorm", nw=nw)
                return _NORMED
            self._gemv(x, w, M, N, K, resid=self.resid)
            return None
        self._gemm(x, w, tmp, M, N, K)
        return tmp

    def _norm(self, delta: Optional[Any], w: Any, T: int) -> None:
        n = self.H
        self.k.launch("add_rmsnorm_bf16", (T,), (min(1024, 32 * math.ceil(n / 128)),),
                      (self.resid, delta if delta is not None else np.uint64(0), w, self.xn, np.int32(n),
                       np.float32(self.eps)))

    def _normed_proj(self, delta: Optional[Any], nw: Any, w: Any, T: int, N: int, r0: int = 0,
                     yb: Any = None, yf: Any = None) -> None:
        """Rows r0..T-1 of rmsnorm(resid + delta) @ w^T: one fused GEMV when the residual stream
        is complete (delta None) and the step is ours, else add+RMSNorm then the product."""
        H = self.H
        if delta is _NORMED:  # xn already holds rmsnorm(resid) * nw (the previous GEMV's epilogue)
            self._gemm(self.xn[r0:T], w, yf if yf is not None else yb, T - r0, N, H, out_f32=yf is not None)
            return
        if delta is None and self.fuse_norm and self._ours(T - r0, H):
            self._gemv(self.resid[r0:T], w, T - r0, N, H, yb=yb, yf=yf, mode="_norm", nw=nw)
            return
        self._norm(delta, nw, T)
        self._gemm(self.xn[r0:T], w, yf if yf is not None else yb, T - r0, N, H, out_f32=yf is not None)

    def _attention(self, lw: Dict[str, Any], T: int, groups: int) -> None:
        """attn_out (T, Hq*D) = causal attention of q (T, Hq, D) over the layer's cache up to pos + t."""
        Hq, Hkv, D, i32, i64 = self.Hq, self.Hkv, self.D, np.int32, np.int64
        qkv = (i64(0), i64(D), i64(Hq * D), i64(0), i64(self.max_len * D), i64(D), i64(0), i64(self.max_len * D), i64(D))
        kb, nsplit = (self.kb, self.nsplit) if T <= ATT_STEP_ROWS else (self.kb_big, self.nsplit_big)
        tail = (i32(Hq), i32(Hkv), i32(T), i32(D), i32(self.max_len), i32(kb), np.float32(D ** -0.5))
        if self.attn == "cluster":  # out (t, h, d) at t*Hq*D + h*D + d: strides (0, D, Hq*D)
            self.k.launch("attn_cluster_bf16", (nsplit, Hkv, groups), (128,),
                          (self.q, lw["k"], lw["v"], self.attn_out, self.pos, i32(0)) + qkv
                          + (i64(0), i64(D), i64(Hq * D)) + tail, cluster=(nsplit, 1, 1))
            return
        # split slots: about two blocks per SM; a block loops over splits slot, slot + slots, ... while
        # they hold visible keys (kernels/attention.cu), so the grid does not grow with max_len
        slots = min(nsplit, max(ATT_MIN_SLOTS, math.ceil(ATT_SLOT_BLOCKS / (Hkv * groups))))
        self.k.launch(self.attn_partial, (slots, Hkv, groups), (128,),
                      (self.q, lw["k"], lw["v"], self.ws_m, self.ws_l, self.ws_acc, self.pos, i32(0)) + qkv + tail
                      + (i32(nsplit),))
        self.k.launch("attn_combine_bf16", (Hq * T,), (32 * math.ceil(D / 32),),
                      (self.ws_m, self.ws_l, self.ws_acc, self.attn_out, i64(0), i64(D), i64(Hq * D),
                       i32(Hq), i32(T), i32(D), i32(nsplit), self.pos, i32(0), i32(self.max_len), i32(kb)))

    def _step(self, T: int, all_logits: bool, advance: bool) -> None:
        """Enqueue one forward step over tokens[0:T] at positions pos..pos+T-1 (no host sync)."""
        k, H, D, Hq, Hkv, I, i32 = self.k, self.H, self.D, self.Hq, self.Hkv, self.I, np.int32
        H3 = Hq + 2 * Hkv
        if self.persistent and T <= 2:
            self._persistent_layers(T)
            self._head(T, all_logits, advance, _NORMED)
            return
        k.launch("embedding_bf16_f32", (T,), (256,), (self.embed, self.tokens, self.resid, i32(self.V), i32(H)))
        groups = math.ceil((Hq // Hkv) * T / ATT_RMAX)
        delta: Optional[Any] = None
        norms = [lw["ln2"] for lw in self.layers]
        nexts = [lw["ln1"] for lw in self.layers[1:]] + [self.final_norm]
        ours = self._ours(T, H)
        # RMSNorm computed by the consuming GEMV itself (from the fp32 residual stream): the QKV GEMV
        # (qkv_norm="consumer" or fuse_norm), the gate/up GEMV (fuse_norm); the projection before only adds
        qkv_consumer = self.qkv_rope and ours and (self.fuse_norm or self.qkv_norm == "consumer") and not self._tc(T)
        gu_consumer = self.silu == "gateup" and ours and self.fuse_norm
        for li, lw in enumerate(self.layers):
            bias = lw["qkv_bias"] if lw["qkv_bias"] is not None else np.uint64(0)
            if self.qkv_rope and ours:  # rope + KV append in the QKV GEMV's epilogue
                tail = (i32(Hq), i32(Hkv), i32(D), i32(self.max_len), np.float32(self.theta))
                mode = "_norm_qkvrope" if qkv_consumer and delta is None else "_qkvrope"
                if mode == "_qkvrope" and delta is not _NORMED:
                    self._norm(delta, lw["ln1"], T)
                x, w = self.resid if mode == "_norm_qkvrope" else self.xn, lw["qkv"]
                name, rows = self._kname(T, H3 * D, mode)
                norm_args = (lw["ln1"], np.float32(self.eps)) if mode == "_norm_qkvrope" else ()
                q8 = self._q8(w, T, H3 * D, mode, H)
                if q8 is not None:  # the 8-bit kernels take (nw, eps) either way, then the scales
                    name, rows, w = q8[0], q8[1], q8[2]
                    norm_args = (lw["ln1"] if norm_args else np.uint64(0), np.float32(self.eps), q8[3])
                k.launch(name, (math.ceil(H3 * D / rows),), (256,),
                         (w, x, i32(H3 * D), i32(H), i32(T), bias, self.q, lw["k"], lw["v"], self.pos) + tail
                         + norm_args)
            else:
                self._normed_proj(delta, lw["ln1"], lw["qkv"], T, H3 * D, yb=self.qkv)
                k.launch("qkv_rope_append_il_bf16" if self.qkv_rope else "qkv_rope_append_bf16", (T, H3),
                         (max(32, D // 2),), (self.qkv, bias, self.q, lw["k"], lw["v"], self.pos, i32(Hq), i32(Hkv),
                                              i32(D), i32(self.max_len), np.float32(self.theta)))
            self._attention(lw, T, groups)
            delta = self._gemm_resid(self.attn_out, lw["o"], self.o, T, H, Hq * D, nw=norms[li])
            if self.silu == "gateup" and ours:  # SwiGLU in the gate/up GEMV's epilogue
                if gu_consumer and delta is None:
                    self._gemv(self.resid, lw["gate_up"], T, 2 * I, H, yb=self.act, mode="_norm_gusilu", nw=lw["ln2"])
                else:
                    if delta is not _NORMED:
                        self._norm(delta, lw["ln2"], T)
                    self._gemv(self.xn, lw["gate_up"], T, 2 * I, H, yb=self.act, mode="_gusilu")
            else:
                self._normed_proj(delta, lw["ln2"], lw["gate_up"], T, 2 * I, yb=self.gu)
            if self.silu == "gateup" and ours:
                nxt = None if qkv_consumer and li + 1 < self.L else nexts[li]  # the next QKV GEMV normalises
                delta = self._gemm_resid(self.act, lw["down"], self.down, T, H, I, nw=nxt)
            elif self.silu == "down" and T == 1 and self._ours(T, I):  # SwiGLU fused into the down projection's input
                self._gemv(self.gu, lw["down"], T, H, I, resid=self.resid, mode="_silu")
                delta = None
            else:
                k.launch("gate_up_silu_il_bf16" if self.silu == "gateup" else "gate_up_silu_bf16",
                         (min(4096, math.ceil(T * I / 256)),), (256,), (self.gu, self.act, np.int64(T), i32(I)))
                delta = self._gemm_resid(self.act, lw["down"], self.down, T, H, I, nw=nexts[li])
        self._head(T, all_logits, advance, delta)

    def _head(self, T: int, all_logits: bool, advance: bool, delta: Optional[Any]) -> None:
        """The final norm (unless delta is _NORMED), the LM head, the token choice, the position advance."""
        k, i32 = self.k, np.int32
        r0 = 0 if all_logits else T - 1
        rows = T - r0
        self._normed_proj(delta, self.final_norm, self.lm_head, T, self.nv, r0=r0, yf=self.logits)
        if self.sampling is None:
            nch, chunk = argmax_plan(self.nv)
            k.launch("argmax_partial_f32", (nch, rows), (256,), (self.logits, self.am_v, self.am_i, i32(self.nv), i32(chunk)))
            k.launch("argmax_final", (rows,), (128,), (self.am_v, self.am_i, self.next_ids[r0:T], i32(nch)))
        else:  # a step of one sampled row draws the next token; a verify step (all rows) writes p rows only
            inv_t, top_k, top_p = self.sampling
            z, V = np.uint64(0), self.nv
            draw = not all_logits
            C = self.sample_cluster
            k.launch("sample_f32", (C, rows), (SAMPLE_THREADS,),
                     (self.logits, np.int64(V), self.probs, np.int64(V), i32(self.max_tokens), self.pos if draw else z,
                      i32(r0), i32(V), np.float32(inv_t), i32(top_k), np.float32(top_p),
                      self.next_ids[r0:T] if draw else z, self.rng), cluster=(C, 1, 1) if C > 1 else None)
        if advance:
            k.launch("decode_advance", (1,), (1,), (self.pos, self.tokens, self.next_ids, self.history, i32(T),
                                                   i32(self.history.size), self.rng, i32(self.sampling is not None)))

    # ------------------------------------------------------------------ host API
    def set_position(self, p: int) -> None:
        """Move the cache position (rolls back speculative entries: they are overwritten later)."""
        if not 0 <= p <= self.max_len:
            raise ValueError(f"position {p} outside the cache (max_len {self.max_len})")
        with self.stream:
            self.k.launch("set_pos", (1,), (1,), (self.pos, np.int32(p)))

    def run(self, ids: List[int], all_logits: bool = True, advance: bool = True, graph: bool = False) -> Any:
        """Process ids at the current position; returns the device int64 greedy next ids (len(ids),)
        (only the last one is computed unless all_logits). graph=True captures/replays per shape."""
        T = len(ids)
        if not 1 <= T <= self.max_tokens:
            raise ValueError(f"a step takes 1..{self.max_tokens} tokens, got {T}")
        with self.stream:
            self.tokens[:T].set(np.asarray(ids, np.int64), stream=self.stream)
            self.replay(T, all_logits, advance) if graph else self._step(T, all_logits, advance)
        return self.next_ids[:T]

    def limit_vocab(self, n: int) -> None:
        """Pick tokens among the first n logits only (a draft and a target whose checkpoints pad their
        vocabularies differently; the tokenizer's size): the LM head computes n rows. Drops the
        captured graphs when n changes."""
        if not 1 <= n <= self.V:
            raise ValueError(f"vocabulary limit {n} outside 1..{self.V}")
        if n != self.nv:
            self.nv = n
            self.graphs.clear()
            self.graph_refs.clear()

    def set_sampling(self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0) -> None:
        """How the following steps pick tokens: temperature 0 = argmax (greedy), else sampled on the
        device (kernels/sampling.cu) from the seeded counter-based generator, whose counter restarts
        at 0 here (same seed, same draws). Graphs are captured per setting."""
        if temperature < 0 or top_k < 0 or not 0 < top_p <= 1:
            raise ValueError(f"bad sampling settings: temperature {temperature}, top_k {top_k}, top_p {top_p}")
        self.sampling = None if temperature == 0 else (1.0 / float(temperature), int(top_k), float(top_p))
        with self.stream:
            self.rng.set(np.array([int(seed), 0], np.uint64), stream=self.stream)

    def replay(self, T: int, all_logits: bool = True, advance: bool = True) -> None:
        """Launch the captured graph for this step shape (capturing it on first use)."""
        self.graph((T, all_logits, advance, self.sampling), lambda: self._step(T, all_logits, advance),
                   lambda: self._step(T, all_logits, False))

    def graph(self, key: Any, enqueue: Any, warm: Any, kernel_names: tuple = ()) -> None:
        """Launch the CUDA graph stored under key; on first use capture enqueue() after one eager
        warm(), which must leave the decoder's state as it was except for cache entries at and after
        the position (it loads the kernel modules and lets cuBLAS pick its algorithms), and after
        loading kernel_names (kernels that enqueue launches but warm does not)."""
        g = self.graphs.get(key)
        if g is None:
            for name in kernel_names:
                self.k.get(name)
            with self.stream:
                warm()
                self.blas.sync_stream()
                self.stream.synchronize()
                self.stream.begin_capture()
                try:
                    enqueue()
                finally:
                    g = self.stream.end_capture()
            self.graphs[key] = g
        g.launch(self.stream)

    def share_stream(self, other: "CudaDecoder") -> None:
        """Run on other's stream from now on (a draft and its target: the verify step then follows the
        draft steps in order, with no host synchronisation between them)."""
        self.stream = other.stream

    def prefill(self, prompt: List[int], chunk: Optional[int] = None) -> int:
        """Run the prompt from position 0; returns the greedy next token."""
        self.set_position(0)
        chunk = chunk or self.max_tokens
        for s in range(0, len(prompt), chunk):
            part = prompt[s:s + chunk]
            self.run(part, all_logits=False, advance=True)
        self.stream.synchronize()
        return int(self.tokens[:1].get()[0])

    def fill_cache(self, prompt: List[int]) -> None:
        """Cache the prompt's keys and values at positions 0..len-1 and leave the position at len(prompt),
        without a next token (the caller sets the next step's input). Each chunk of up to max_tokens tokens
        runs as ONE captured graph of max_tokens rows, the chunk padded with its last token: an eager step
        launches ~10 kernels a layer from Python (round 10, GSM8K on an H200: the speculative pair's prefill
        8.2% of the run's time eager, 1.6% as graphs). The padded rows write
        cache entries past the chunk, which no step reads before writing them (attention reads positions up
        to the step's own, and a step writes its own positions first); a chunk whose padded rows would pass
        max_len runs eagerly. The real rows get what an eager step of max_tokens rows gives them: with chunks
        of at most 16 rows in the exact modes an eager prefill's bits, since a token's products there do not
        depend on the row count (tests/test_cuda_prefill.py, passed on the H200); longer chunks run cuBLAS,
        whose rounding may depend on the row count, so a near-tie may later resolve differently than after an
        eager prefill of another chunk size (3 of 20 GSM8K target texts in round 10)."""
        B = self.max_tokens
        self.set_position(0)
        for s in range(0, len(prompt), B):
            part = [int(t) for t in prompt[s:s + B]]  # a list (padding below concatenates)
            if s + B <= self.max_len:
                self.run(part + part[-1:] * (B - len(part)), all_logits=False, advance=True, graph=True)
            else:
                self.run(part, all_logits=False, advance=True)
        self.set_position(len(prompt))  # the last chunk advanced by its padded length
        self.stream.synchronize()

    def decode(self, n: int, sync_every: int = 1) -> List[int]:
        """Greedy-decode n tokens after prefill by replaying the T=1 graph; the ids are read back
        every `sync_every` steps (1 = after each token, as a stop-token check would need)."""
        p0 = int(self.pos.get()[0])
        if p0 + n > self.max_len:
            raise ValueError(f"decoding {n} tokens from position {p0} overflows the cache ({self.max_len})")
        out: List[int] = []
        for i in range(n):
            self.replay(1, all_logits=False, advance=True)
            if (i + 1) % sync_every == 0 or i == n - 1:
                self.stream.synchronize()
        self.stream.synchronize()
        out = [int(t) for t in self.history[p0 + 1:p0 + 1 + n].get()]
        return out
