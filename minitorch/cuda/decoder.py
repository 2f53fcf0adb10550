"""Graph-captured Qwen2 decoding on the GPU: the fast path behind `--backend cuda` and `project/bench/throughput.py`.

`CudaDecoder` holds a Qwen2-architecture model's weights on the device in bf16 (q/k/v and gate/up
projections concatenated so each is one product), a preallocated KV cache, and every activation buffer.
One step over T tokens is built from named stages (`_step`):

    _embed -> per layer [_qkv (norm, QKV product, bias + rope + KV append), _attention (split partials +
    combine), _o_proj (product added into the fp32 residual stream, next norm in its epilogue), _mlp (norm,
    gate/up product writing the SwiGLU product, down product added into the residual)] -> _head (final
    norm, LM head, argmax or sampling, position advance)

`_plan(T)` is the one place that decides which kernels a step of T tokens runs: our bf16 GEMV (kernels/gemv.cu)
for decode / verify steps, CUDA-core (`gemv1*`, `gemv4*` ...) or tensor-core (`gemvtc*`), with the
epilogues fused in; cuBLAS and separate norm / SwiGLU / rope kernels for longer (prefill) steps. The gate/up
weight rows are interleaved (gate j, up j) so the gate/up GEMV writes the SwiGLU product itself; q/k/v rows
are permuted within each head so the QKV GEMV applies rope and appends to the KV cache; for hidden sizes <=
2048 the CUDA-core QKV GEMV normalises its own input (the down projection before it only adds).

Which kernels (`gemv`): "tc" (tensor-core GEMV for steps of <= 16 tokens; the CLI's target default) and "ours"
(CUDA-core GEMV for <= 16 tokens; the fastest target alone) are exact: every kernel of a step computes each
token's values in an order that does not depend on how many tokens the step holds (kernels/gemv.cu,
attention.cu), so a verify step reproduces the decode steps' logits bit for bit and greedy speculative output
equals greedy autoregressive output by construction; "auto" (the default) is the exact one the GPU runs best
(resolve_gemv). "ours1" (`--fast-verify`, only when asked) runs
one-token steps in our GEMV and verifies with cuBLAS (a different summation order: a near-tie between the
top two logits can resolve differently). "ourstc" (a speculative draft's, whose bits never reach the output):
one-token steps CUDA-core, longer ones tensor-core, the faster at each size. `int8_weights` (a draft's): one-
and two-token steps read 8-bit copies of the weight rows. Variants that lost their A/B (persistent step,
fused norms, 2-row blocks, cluster attention, ...) are listed in kernels/NOTES.md with the commit to recover them.

The cache position lives in device memory, so a step captured once per T as a CUDA graph replays at any
position; the only host synchronisation is reading token ids back. cuBLAS is called through ctypes
(capture-safe); everything else is kernels/*.cu.

The config is any object with the Hugging Face Qwen2 field names (hidden_size, num_hidden_layers,
num_attention_heads, num_key_value_heads, intermediate_size, vocab_size, rope_theta, rms_norm_eps,
tie_word_embeddings); weights are a dict keyed by checkpoint names (model.layers.0.self_attn.q_proj.weight,
...), as float32/bf16 numpy or CuPy arrays.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, NamedTuple, Optional

import numpy as np

from .blas import CUDA_R_16BF, CUDA_R_32F, cublas
from .launch import (ATT_MIN_SLOTS, ATT_RMAX, ATT_SLOT_BLOCKS, SAMPLE_CLUSTER, SAMPLE_THREADS, WIDE_ROWS, argmax_plan,
                     attn_partial_kernel, cluster_supported, resnorm_rows, tensor_cores_supported)
from .pdl import PdlLauncher
from .runtime import get_cupy, kernels


# kernels/gemv.cu's one- and two-token products on 8-bit rows (CudaDecoder(int8_weights=True)) by input / output
# mode: 4 output rows a block, or I8_BIG_ROWS for products of many rows (N > 8192, K <= 4096: gate/up, the LM head)
I8_MODES = ("", "_gusilu", "_resnorm", "_qkvrope", "_norm_qkvrope")
I8_BIG_MODES = ("", "_gusilu")
I8_BIG_ROWS = {1: 16, 2: 8}  # by tokens a step
MAX_LEN = 32768  # cache positions of a decoder made by from_model (at most the model's own context)
ATT_STEP_ROWS = 16  # steps of at most this many tokens (decode, verify) share one attention split size
GEMV_MODES = ("ours", "ours1", "tc", "ourstc")  # CudaDecoder(gemv=...): module doc
GEMV_DEFAULTS = ("auto", "draft")  # resolved by resolve_gemv: the exact default, a draft's fastest


def resolve_gemv(gemv: str) -> str:
    """The one default of each role: "auto" (a target's) = "tc" on GPUs with tensor cores (compute capability
    >= 8.0), else "ours": both exact; "draft" (a draft model's or head's, whose bits never reach the output) =
    "ourstc" there, else "ours". Any other mode as it is."""
    if gemv not in GEMV_DEFAULTS:
        return gemv
    tc = tensor_cores_supported()
    return ("tc" if tc else "ours") if gemv == "auto" else ("ourstc" if tc else "ours")
GEMV_TOKENS = {"ours": 16, "ours1": 1, "tc": 16, "ourstc": 16}  # steps of at most this many tokens run our GEMV
TC_TILE_NAMES = {1: "", 2: "w"}  # weight tiles of 8 rows a block -> kernels/gemv.cu gemvtc{8,16}{..}_* suffix


def tc_tiles(M: int, N: int, K: int) -> int:
    """Weight tiles of 8 rows a block (1 or 2) of the tensor-core product of M tokens, N rows of K inputs: two for
    many output rows. Every block reads all M tokens' inputs beside its rows, so more rows a block would read fewer
    input bytes (through L2), but in fewer blocks: on an H100, two or four tiles for every product of 9-16 tokens made
    those steps 5-15% slower (docs/results/h100_tc_tiles/, tools/tc_tiles.py). The tiles change no bit
    (kernels/gemv.cu gemv_tc_body, tests/test_cuda_gemv_tokens.py)."""
    return 2 if N > WIDE_ROWS else 1


QKV_NORM_MAX_HIDDEN = 2048  # up to this hidden size the CUDA-core QKV GEMV normalises its own input
SPLIT_NORM_FROM: Optional[int] = 2  # steps of at least this many tokens add into the residual in the GEMV and
# normalise its rows in their own kernel (gemv_resnorm_rows_bf16, a block a row: the function and block size of the
# resnorm epilogue's last block, so the same bits) instead of that last block normalising them one after another; None:
# never. H100, random weights of the 1.5B (`tools/verify_profile.py --split-ab`, docs/results/h100_split_norm/): a
# step of 5 / 8 / 13 / 16 tokens costs 1.022 / 1.042 / 1.160 / 1.191 one-token steps against the epilogue's 1.139 /
# 1.237 / 1.486 / 1.592, the logits the same bits (GSM8K first 20 at gamma 4: 2.29x against 2.08x). A one-token step
# keeps the epilogue: from 1 it too was 1.3% faster, same bits, but that is unmeasured end to end
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


TREE_MAX_ROWS = 16  # a tree's verify step: at most the tensor-core GEMV's exact token count (GEMV_TOKENS["tc"])


class TreeTables:
    """Device tables of one draft-tree shape (CudaDecoder.tree_tables): row r > 0 hangs under row parents[r] < r
    (row 0: the root, the pending token), at depth depth[r]; anc[r, k] = the row of r's ancestor at depth k (k =
    0..depth[r], the last being r itself); tpos: the rows' positions, written by each step (tree_positions); path:
    the accepted rows (tree_accept). A captured step keeps pointers to these arrays, so a shape's tables live as long
    as its graphs."""

    def __init__(self, cp: Any, parents: "tuple[int, ...]") -> None:
        T = len(parents)
        if T < 1 or parents[0] != -1 or any(not 0 <= p < r for r, p in enumerate(parents) if r):
            raise ValueError(f"tree parents {parents}: row 0 is the root (-1), every other row's parent an earlier row")
        depth = [0] * T
        for r in range(1, T):
            depth[r] = depth[parents[r]] + 1
        self.T, self.depth_host, self.width = T, tuple(depth), max(depth) + 1
        anc = np.zeros((T, self.width), np.int32)
        for r in range(1, T):  # a row's path: its parent's, then itself
            anc[r] = anc[parents[r]]
            anc[r, depth[r]] = r
        self.parents = cp.asarray(np.asarray(parents, np.int32))
        self.depth = cp.asarray(np.asarray(depth, np.int32))
        self.anc = cp.asarray(anc)
        self.tpos = cp.zeros(T, cp.int32)
        self.path = cp.zeros(T + 1, cp.int32)


class StepPlan(NamedTuple):
    """Which kernels a step of T tokens runs (CudaDecoder._plan)."""

    ours: bool  # products in our GEMV (kernels/gemv.cu, epilogues fused), else cuBLAS + separate kernels
    tc: bool  # ... in its tensor-core version (gemvtc*)
    qkv_norm: bool  # the QKV GEMV normalises its own input (the down projection before it only adds)
    groups: int  # attention row groups of ATT_RMAX query rows a kv head
    tree: Optional["TreeTables"] = None  # a draft tree's step (tree_step): rows at their depths, seeing their paths
    split_norm: bool = False  # our GEMVs add into the residual and gemv_resnorm_rows_bf16 normalises it (SPLIT_NORM_FROM)


class CudaDecoder:
    """A Qwen2 model resident on the GPU with a KV cache of max_len positions and CUDA-graph steps."""

    graph_decoder = True  # generation/engine.py runs it on the CUDA-graph engine (generation/cuda.py)

    def __init__(self, cfg: Any, weights: Dict[str, Any], max_len: int, max_tokens: int = 128,
                 gemv: str = "auto", pdl: Optional[bool] = None, attn_kb: Optional[int] = None,
                 int8_weights: bool = False, graph_prefill: bool = True) -> None:
        """gemv: which kernels a step runs (module doc): "tc" / "ours" exact (verify == decode bit for bit),
        "ours1" one-token steps ours and verify in cuBLAS, "ourstc" a draft's fastest at each step size.
        pdl: launch the step's kernels with programmatic dependent launch (minitorch/cuda/pdl.py); None
        (default) = on for compute capability >= 9.0 (H200: 1.5B decode step 1.78 -> 1.63 ms).
        attn_kb: keys per attention split of steps of <= 16 tokens (a multiple of 32; default 32 up to 32,768
        cache positions, then the least multiple of 32 that keeps 1024 splits); any fixed value keeps verify ==
        decode bit for bit. A step's attention costs what its visible splits cost, not max_len.
        int8_weights (a speculative draft's): steps of one or two tokens run every projection and the LM head on
        8-bit copies of the weight rows, one scale a row (quantize_rows_int8; gemv{1,2}*_i8): half the bytes
        (H200, 0.5B one-token step 0.593 against 0.660 ms). Its numbers differ from the bf16 rows', which a
        draft's never reach the output; longer steps keep the bf16 rows, which stay resident too.
        graph_prefill: generation fills the prompt's cache with fill_cache (chunks padded to max_tokens rows, one
        captured graph each; default) instead of eager prefill steps (--gpu-prefill eager)."""
        gemv = resolve_gemv(gemv)
        if gemv not in GEMV_MODES:
            raise ValueError(f"gemv must be one of {', '.join(map(repr, GEMV_MODES))}, got {gemv!r}")
        if gemv in ("tc", "ourstc") and not tensor_cores_supported():
            raise ValueError(f"gemv={gemv!r} needs a GPU of compute capability >= 8.0 (mma.m16n8k16 bf16)")
        self.cp = get_cupy()
        self.gemv = gemv
        self.cfg = cfg
        self.max_len, self.max_tokens = max_len, max_tokens
        self._read_config(cfg)
        # the tensor-core GEMV takes bf16 inputs, so under "tc" the norm is always a projection's epilogue
        self.qkv_norm_in_gemv = self.H <= QKV_NORM_MAX_HIDDEN and gemv != "tc"
        self.split_norm_from = SPLIT_NORM_FROM
        self._load_weights(weights)
        self._alloc_buffers()
        self._attention_setup(attn_kb)
        self.blas = cublas()
        self.pdl = cluster_supported() if pdl is None else bool(pdl)  # PDL and clusters both arrive with sm_90
        self.k = PdlLauncher(kernels(), pdl=self.pdl)
        self.q8: Dict[int, "tuple[Any, Any]"] = {}  # 8-bit copies of projection rows, by the bf16 array's pointer
        if int8_weights:
            self._quantize_int8()
        self.graph_prefill = bool(graph_prefill)
        self.stream = self.cp.cuda.Stream(non_blocking=True)
        self.graphs: Dict[Any, Any] = {}
        self.graph_refs: Dict[Any, Any] = {}  # objects whose device buffers a captured graph uses
        self._tree: Optional[TreeTables] = None  # set while a tree step is enqueued (tree_step; _plan reads it)
        self._tree_tables: Dict[Any, TreeTables] = {}
        self._kv_ptrs: Any = None  # every layer's K and V cache pointers (tree_keep)

    @classmethod
    def from_model(cls, model: Any, max_len: Optional[int] = None, **kw: Any) -> "CudaDecoder":
        """A CudaDecoder of a loaded minitorch Qwen2 model (models/qwen2.py, any backend; its weights are read in
        float32 and held in bf16): max_len cache positions, default the model's context up to MAX_LEN; kw as the
        constructor's (gemv, int8_weights, graph_prefill...)."""
        limit = int(getattr(model.config, "max_position_embeddings", 0) or MAX_LEN)
        return cls(model.config, weights_from_model(model), max_len=min(max_len or limit, limit, MAX_LEN), **kw)

    def batch_decoder(self, slots: int, max_len: int, vocab_size: Optional[int] = None, **kw: Any) -> Any:
        """A BatchDecoder (minitorch/cuda/batch.py) over this decoder's weights: `slots` sequences decoded at once,
        max_len cache positions each; what the engine's generate_batch runs on the GPU."""
        from .batch import BatchDecoder

        return BatchDecoder(self, slots, max_len, vocab_size=vocab_size, **kw)

    @property
    def config(self) -> Any:
        """The model config (generation's request checks read config.max_position_embeddings)."""
        return self.cfg

    # ------------------------------------------------------------------ setup
    def _read_config(self, cfg: Any) -> None:
        H, Hq, Hkv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
        D = getattr(cfg, "head_dim", None) or H // Hq
        if D % 2 or D > 256 or Hq % Hkv:
            raise ValueError(f"unsupported attention shape: {Hq} heads of {D}, {Hkv} kv heads")
        self.H, self.I, self.V, self.Hq, self.Hkv, self.D = H, cfg.intermediate_size, cfg.vocab_size, Hq, Hkv, D
        self.nv = self.V  # candidate tokens: the first nv logits (limit_vocab); logits rows have nv columns
        self.L = cfg.num_hidden_layers
        self.eps = float(cfg.rms_norm_eps)
        self.theta = float(cfg.rope_theta)

    def _load_weights(self, weights: Dict[str, Any]) -> None:
        """bf16 device copies in the layouts our epilogues need, and each layer's KV cache."""
        cp, cfg, H, I, D, Hkv = self.cp, self.cfg, self.H, self.I, self.D, self.Hkv
        H3 = self.Hq + 2 * Hkv
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
            # rows of each head: 0, D/2, 1, D/2 + 1, ... (rotation pairs adjacent: rope in the QKV GEMV's epilogue)
            qkv = cp.ascontiguousarray(qkv.reshape(H3, 2, D // 2, H).transpose(0, 2, 1, 3).reshape(H3 * D, H))
            if bias is not None:
                bias = cp.ascontiguousarray(bias.reshape(H3, 2, D // 2).transpose(0, 2, 1).reshape(-1))
            # rows gate 0, up 0, gate 1, up 1, ... (2I, H): SwiGLU in the gate/up GEMV's epilogue
            gu = cp.stack([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")], axis=1).reshape(2 * I, H)
            self.layers.append(dict(
                qkv=qkv, qkv_bias=bias, o=get(p + "self_attn.o_proj.weight"), gate_up=cp.ascontiguousarray(gu),
                down=get(p + "mlp.down_proj.weight"), ln1=get(p + "input_layernorm.weight"),
                ln2=get(p + "post_attention_layernorm.weight"),
                k=cp.zeros((Hkv, self.max_len, D), cp.uint16), v=cp.zeros((Hkv, self.max_len, D), cp.uint16)))

    def _alloc_buffers(self) -> None:
        """Activation, token, sampling and speculation buffers for steps of up to max_tokens tokens."""
        cp, T, H, I, V, D, Hq = self.cp, self.max_tokens, self.H, self.I, self.V, self.D, self.Hq
        H3 = Hq + 2 * self.Hkv
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
        self.history = cp.zeros(self.max_len + T, cp.int64)
        self.am_v = cp.zeros(T * argmax_plan(V)[0], cp.float32)
        self.am_i = cp.zeros(T * argmax_plan(V)[0], cp.int32)
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
        self.context = cp.zeros(self.max_len + T + 2, cp.int64)
        self.context_len = cp.zeros(1, cp.int32)

    def _attention_setup(self, attn_kb: Optional[int]) -> None:
        """Keys per attention split and the split workspace. Decode / verify steps (<= ATT_STEP_ROWS tokens): one
        32-key chunk up to 32k positions, at most 1024 splits beyond; longer (prefill) steps, which need not match
        them bit for bit, use at most 256 larger splits (the workspace holds max_tokens rows of those)."""
        cp, max_len, T, D = self.cp, self.max_len, self.max_tokens, self.D
        self.kb = int(attn_kb) if attn_kb is not None else 32 * max(1, math.ceil(max_len / (32 * 1024)))
        if self.kb < 32 or self.kb % 32:
            raise ValueError(f"attn_kb must be a positive multiple of 32, got {attn_kb!r}")
        self.nsplit = math.ceil(max_len / self.kb)
        self.kb_big = max(self.kb, 32 * max(1, math.ceil(max_len / (32 * 256))))
        self.nsplit_big = math.ceil(max_len / self.kb_big)
        kv = (max_len * D, D, 1)  # the caches: (Hkv, max_len, D) bf16, fresh (aligned) allocations
        self.attn_partial = attn_partial_kernel("bf16", D, kv, kv, 0, 0)
        ws_rows = self.Hq * max(min(T, ATT_STEP_ROWS) * self.nsplit, T * self.nsplit_big)
        self.ws_m = cp.zeros(ws_rows, cp.float32)
        self.ws_l = cp.zeros(ws_rows, cp.float32)
        self.ws_acc = cp.zeros(ws_rows * D, cp.float32)

    def _int8_rows(self) -> "list[tuple[Any, int]]":
        """(bf16 weight, leading rows) pairs that int8_weights copies to 8 bits: every projection and the LM head."""
        return [(lw[n], lw[n].shape[0]) for lw in self.layers for n in ("qkv", "o", "gate_up", "down")] + \
            [(self.lm_head, self.lm_head.shape[0])]

    def _quantize_int8(self) -> None:
        """8-bit codes + a scale a row of the weights _int8_rows names (int8_weights), kept by the bf16 array's
        pointer (_q8 looks them up there)."""
        cp = self.cp
        why = int8_unsupported(self.cfg)
        if why:
            raise ValueError(why)
        for w, n in self._int8_rows():
            if w.data.ptr in self.q8:
                continue
            codes, scales = cp.empty((n, w.shape[1]), cp.int8), cp.empty(n, cp.float32)
            for r in range(0, n, 16384):  # a slice at a time: float32 copies of big rows are large
                e = min(r + 16384, n)
                f = (w[r:e].astype(cp.uint32) << 16).view(cp.float32)
                codes[r:e], scales[r:e] = quantize_rows_int8(cp, f)
            self.q8[w.data.ptr] = (codes, scales)

    # ------------------------------------------------------------------ which kernels
    def _ours(self, M: int, K: int) -> bool:
        """Whether an M-token product runs in our GEMV (else cuBLAS)."""
        return M <= GEMV_TOKENS[self.gemv] and K % 8 == 0

    def _tc(self, M: int) -> bool:
        """Whether an M-token product of ours runs in the tensor-core GEMV."""
        return self.gemv == "tc" or (self.gemv == "ourstc" and M > 1)

    def _plan(self, T: int) -> StepPlan:
        """The kernels of a step of T tokens: the one place that decides them (with _kname for the names)."""
        ours, tc = self._ours(T, self.H), self._tc(T)
        return StepPlan(ours=ours, tc=tc, qkv_norm=ours and not tc and self.qkv_norm_in_gemv,
                        groups=math.ceil((self.Hq // self.Hkv) * T / ATT_RMAX), tree=self._tree,
                        split_norm=ours and self.split_norm_from is not None and T >= self.split_norm_from)

    def _kname(self, M: int, N: int, mode: str, K: int = 0) -> "tuple[str, int]":
        """(kernel name, output rows a block) of the kernels/gemv.cu instantiation for an M-token
        product of N outputs (rows of K) in input/output mode `mode` ("", "_resnorm", "_qkvrope", ...)."""
        if self._tc(M):  # one kernel for 1..8 tokens (decode and verify alike), one for 9..16
            if mode not in ("", "_gusilu", "_resnorm", "_qkvrope"):
                raise ValueError(f"no tensor-core GEMV for mode {mode!r}")
            nt = tc_tiles(M, N, K)
            return f"gemvtc{8 if M <= 8 else 16}{TC_TILE_NAMES[nt]}{mode}_bf16", 8 * nt
        tm = 1 if M == 1 else 4 if M <= 4 else 5 if M == 5 else 8 if M <= 8 else 16
        if tm == 1 and N > WIDE_ROWS and K <= 2048 and mode in ("", "_gusilu"):  # wide products with short rows
            return f"gemv1r8{mode}_bf16", 8
        return f"gemv{tm}{mode}_bf16", (2 if tm == 16 else 4)

    def _q8(self, w: Any, M: int, N: int, mode: str, K: int) -> "Optional[tuple]":
        """(kernel, rows a block, codes, scales) of the 8-bit product of M = 1 or 2 tokens for weight w
        (int8_weights), or None: a step of more tokens or one for the tensor-core GEMV ("ourstc": faster at two
        tokens than 8-bit rows in the CUDA-core one), or a weight without 8-bit rows."""
        if M not in I8_BIG_ROWS or self._tc(M) or not self.q8 or w.data.ptr not in self.q8 or mode not in I8_MODES:
            return None
        codes, scales = self.q8[w.data.ptr]
        if codes.shape[0] < N:  # 8-bit copies of fewer rows than asked (a head's LM head: its head_vocab rows)
            return None
        big = I8_BIG_ROWS[M] if N > WIDE_ROWS and K <= 4096 and mode in I8_BIG_MODES else 0
        return f"gemv{M}{f'r{big}' if big else ''}{mode}_i8", (big or 4), codes, scales

    # ------------------------------------------------------------------ products
    def _gemv(self, x: Any, w: Any, M: int, N: int, K: int, yb: Any = None, yf: Any = None,
              resid: Any = None, mode: str = "", nw: Any = None) -> None:
        """kernels/gemv.cu; mode "" (x bf16), "_gusilu" (interleaved gate/up rows -> yb = SwiGLU product) or
        "_resnorm" (resid += x @ w^T, then yb = RMSNorm(resid) * nw)."""
        name, rows = self._kname(M, N, mode, K)
        z = np.uint64(0)
        q8 = self._q8(w, M, N, mode, K)
        if q8 is not None:
            name, rows, w = q8[0], q8[1], q8[2]
        args = (w, x, nw if nw is not None else z, np.float32(self.eps), yb if yb is not None else z,
                yf if yf is not None else z, resid if resid is not None else z, np.int32(N), np.int32(K),
                np.int32(M), np.int32(K))
        if q8 is not None:
            args = args + (self.counter, q8[3])
        elif mode in ("_gusilu", "_resnorm"):
            args = args + (self.counter,)
        self.k.launch(name, (math.ceil(N / rows),), (256,), args)

    def _gemm(self, x: Any, w: Any, y: Any, M: int, N: int, K: int, out_f32: bool = False) -> None:
        """y[M, N] = x[M, K] @ w[N, K]^T (bf16, or fp32 logits)."""
        if self._ours(M, K):
            self._gemv(x, w, M, N, K, yf=y if out_f32 else None, yb=None if out_f32 else y)
            return
        self.blas.linear(x.data.ptr, w.data.ptr, y.data.ptr, M, N, K, CUDA_R_16BF, CUDA_R_16BF,
                         CUDA_R_32F if out_f32 else CUDA_R_16BF)

    def _gemm_resid(self, x: Any, w: Any, tmp: Any, M: int, N: int, K: int, nw: Any = None,
                    split: bool = False) -> Optional[Any]:
        """Project and add into the fp32 residual stream; returns the bf16 delta still to be added
        (cuBLAS path: the next add+RMSNorm adds it), None (our GEMV added it already) or _NORMED
        (our GEMV added it and xn = RMSNorm(resid) * nw is written as well: by its last block, or with split
        (StepPlan.split_norm) by gemv_resnorm_rows_bf16 after it, a block a row)."""
        if self._ours(M, K):
            if nw is not None:
                if split:
                    self._gemv(x, w, M, N, K, resid=self.resid)
                    resnorm_rows(self.k, self.resid, nw, self.xn, M, N, self.eps)
                else:
                    self._gemv(x, w, M, N, K, yb=self.xn, resid=self.resid, mode="_resnorm", nw=nw)
                return _NORMED
            self._gemv(x, w, M, N, K, resid=self.resid)
            return None
        self._gemm(x, w, tmp, M, N, K)
        return tmp

    def _norm(self, delta: Optional[Any], w: Any, T: int) -> None:
        """xn = RMSNorm(resid += delta) * w (delta None: the residual stream is complete)."""
        n = self.H
        self.k.launch("add_rmsnorm_bf16", (T,), (min(1024, 32 * math.ceil(n / 128)),),
                      (self.resid, delta if delta is not None else np.uint64(0), w, self.xn, np.int32(n),
                       np.float32(self.eps)))

    def _normed_proj(self, delta: Optional[Any], nw: Any, w: Any, T: int, N: int, r0: int = 0,
                     yb: Any = None, yf: Any = None) -> None:
        """Rows r0..T-1 of rmsnorm(resid + delta) @ w^T (the norm unless the previous epilogue wrote it)."""
        if delta is not _NORMED:
            self._norm(delta, nw, T)
        self._gemm(self.xn[r0:T], w, yf if yf is not None else yb, T - r0, N, self.H, out_f32=yf is not None)

    # ------------------------------------------------------------------ one step (capturable)
    def _step(self, T: int, all_logits: bool, advance: bool) -> None:
        """Enqueue one forward step over tokens[0:T] at positions pos..pos+T-1 (no host sync)."""
        plan = self._plan(T)
        self._embed(T)
        delta: Optional[Any] = None  # what the residual stream still lacks (None / _NORMED / a bf16 delta)
        for li, lw in enumerate(self.layers):
            self._qkv(lw, T, delta, plan)
            self._attention(lw, T, plan)
            delta = self._o_proj(lw, T, plan)
            last = li + 1 == self.L
            delta = self._mlp(lw, T, delta, plan, self.final_norm if last else self.layers[li + 1]["ln1"], last)
        self._head(T, all_logits, advance, delta)

    def _embed(self, T: int) -> None:
        """resid (T, H) fp32 = the tokens' embedding rows."""
        self.k.launch("embedding_bf16_f32", (T,), (256,),
                      (self.embed, self.tokens, self.resid, np.int32(self.V), np.int32(self.H)))

    def _qkv(self, lw: Dict[str, Any], T: int, delta: Optional[Any], plan: StepPlan) -> None:
        """q (T, Hq, D) and the KV cache's new entries = rope(RMSNorm(resid) @ qkv^T + bias)."""
        k, H, D, Hq, Hkv, i32 = self.k, self.H, self.D, self.Hq, self.Hkv, np.int32
        H3 = Hq + 2 * Hkv
        bias = lw["qkv_bias"] if lw["qkv_bias"] is not None else np.uint64(0)
        tail = (i32(Hq), i32(Hkv), i32(D), i32(self.max_len), np.float32(self.theta))
        if not plan.ours:  # cuBLAS, then bias + rope + KV append
            self._normed_proj(delta, lw["ln1"], lw["qkv"], T, H3 * D, yb=self.qkv)
            k.launch("qkv_rope_append_il_bf16", (T, H3), (max(32, D // 2),),
                     (self.qkv, bias, self.q, lw["k"], lw["v"], self.pos) + tail)
            return
        # our GEMV: rope + KV append in its epilogue; it normalises its own input (the residual stream, complete:
        # delta None) with plan.qkv_norm, else reads xn (normalised by the previous epilogue or here)
        mode = "_norm_qkvrope" if plan.qkv_norm and delta is None else "_qkvrope"
        if mode == "_qkvrope" and delta is not _NORMED:
            self._norm(delta, lw["ln1"], T)
        x, w = (self.resid if mode == "_norm_qkvrope" else self.xn), lw["qkv"]
        name, rows = self._kname(T, H3 * D, mode, H)
        norm_args = (lw["ln1"], np.float32(self.eps)) if mode == "_norm_qkvrope" else ()
        if plan.tree is not None:  # a tree's rows: rotated at their depths, cached at their rows (tree_step)
            k.launch(name.replace("_qkvrope_bf16", "_qkvrope_tree_bf16"), (math.ceil(H3 * D / rows),), (256,),
                     (w, x, i32(H3 * D), i32(H), i32(T), bias, self.q, lw["k"], lw["v"], self.pos) + tail
                     + (plan.tree.depth,))
            return
        q8 = self._q8(w, T, H3 * D, mode, H)
        if q8 is not None:  # the 8-bit kernels take (nw, eps) either way, then the scales
            name, rows, w = q8[0], q8[1], q8[2]
            norm_args = (lw["ln1"] if norm_args else np.uint64(0), np.float32(self.eps), q8[3])
        k.launch(name, (math.ceil(H3 * D / rows),), (256,),
                 (w, x, i32(H3 * D), i32(H), i32(T), bias, self.q, lw["k"], lw["v"], self.pos) + tail + norm_args)

    def _attention(self, lw: Dict[str, Any], T: int, plan: StepPlan) -> None:
        """attn_out (T, Hq*D) = causal attention of q (T, Hq, D) over the layer's cache up to pos + t (a tree step:
        each row over the cache below pos and its own path, kernels/attention.cu attn_tree_partial_*)."""
        Hq, Hkv, D, i32, i64 = self.Hq, self.Hkv, self.D, np.int32, np.int64
        groups = plan.groups
        if plan.tree is not None:
            tr, G = plan.tree, Hq // Hkv
            slots = min(self.nsplit, max(ATT_MIN_SLOTS, math.ceil(ATT_SLOT_BLOCKS / (Hkv * T))))
            self.k.launch(f"attn_tree_partial_bf16_d{D}", (slots, T * Hkv, math.ceil(G / ATT_RMAX)), (128,),
                          (self.q, lw["k"], lw["v"], self.ws_m, self.ws_l, self.ws_acc, tr.tpos, self.pos, tr.anc,
                           i32(tr.width), i64(Hq * D), i64(D), i64(self.max_len * D), i64(D), i32(Hq), i32(Hkv),
                           i32(self.max_len), i32(self.kb), np.float32(D ** -0.5), i32(self.nsplit)))
            self.k.launch("attn_rows_combine_bf16", (T * Hq,), (32 * math.ceil(D / 32),),
                          (self.ws_m, self.ws_l, self.ws_acc, self.attn_out, i32(Hq), i32(D), i32(self.nsplit),
                           tr.tpos, i32(self.max_len), i32(self.kb)))
            return
        qkv = (i64(0), i64(D), i64(Hq * D), i64(0), i64(self.max_len * D), i64(D), i64(0), i64(self.max_len * D), i64(D))
        kb, nsplit = (self.kb, self.nsplit) if T <= ATT_STEP_ROWS else (self.kb_big, self.nsplit_big)
        tail = (i32(Hq), i32(Hkv), i32(T), i32(D), i32(self.max_len), i32(kb), np.float32(D ** -0.5))
        # split slots: about two blocks per SM; a block loops over splits slot, slot + slots, ... while
        # they hold visible keys (kernels/attention.cu), so the grid does not grow with max_len
        slots = min(nsplit, max(ATT_MIN_SLOTS, math.ceil(ATT_SLOT_BLOCKS / (Hkv * groups))))
        self.k.launch(self.attn_partial, (slots, Hkv, groups), (128,),
                      (self.q, lw["k"], lw["v"], self.ws_m, self.ws_l, self.ws_acc, self.pos, i32(0)) + qkv + tail
                      + (i32(nsplit),))
        self.k.launch("attn_combine_bf16", (Hq * T,), (32 * math.ceil(D / 32),),
                      (self.ws_m, self.ws_l, self.ws_acc, self.attn_out, i64(0), i64(D), i64(Hq * D),
                       i32(Hq), i32(T), i32(D), i32(nsplit), self.pos, i32(0), i32(self.max_len), i32(kb)))

    def _o_proj(self, lw: Dict[str, Any], T: int, plan: StepPlan) -> Optional[Any]:
        """resid += attn_out @ o^T; our GEMV also writes xn = RMSNorm(resid) * ln2 (returns _NORMED)."""
        return self._gemm_resid(self.attn_out, lw["o"], self.o, T, self.H, self.Hq * self.D, nw=lw["ln2"],
                                split=plan.split_norm)

    def _mlp(self, lw: Dict[str, Any], T: int, delta: Optional[Any], plan: StepPlan, next_norm: Any,
             last: bool) -> Optional[Any]:
        """resid += down(silu(gate) * up) of RMSNorm(resid) * ln2. next_norm: the norm after this layer (the next
        layer's ln1, or the final norm), which our down GEMV writes into xn unless the next QKV GEMV normalises
        its own input (plan.qkv_norm). Returns what the residual stream still lacks."""
        H, I = self.H, self.I
        if plan.ours:  # SwiGLU in the gate/up GEMV's epilogue
            if delta is not _NORMED:
                self._norm(delta, lw["ln2"], T)
            self._gemv(self.xn, lw["gate_up"], T, 2 * I, H, yb=self.act, mode="_gusilu")
            nxt = None if plan.qkv_norm and not last else next_norm
            return self._gemm_resid(self.act, lw["down"], self.down, T, H, I, nw=nxt, split=plan.split_norm)
        self._normed_proj(delta, lw["ln2"], lw["gate_up"], T, 2 * I, yb=self.gu)
        self.k.launch("gate_up_silu_il_bf16", (min(4096, math.ceil(T * I / 256)),), (256,),
                      (self.gu, self.act, np.int64(T), np.int32(I)))
        return self._gemm_resid(self.act, lw["down"], self.down, T, H, I, nw=next_norm)

    def _head(self, T: int, all_logits: bool, advance: bool, delta: Optional[Any]) -> None:
        """The final norm (unless delta is _NORMED), the LM head, the token choice, the position advance."""
        r0 = 0 if all_logits else T - 1
        self._normed_proj(delta, self.final_norm, self.lm_head, T, self.nv, r0=r0, yf=self.logits)
        self._choose(T, all_logits, advance)

    def _choose(self, T: int, all_logits: bool, advance: bool) -> None:
        """After the LM head wrote logits rows (all T, or the last one): argmax or sampling, the position advance."""
        k, i32 = self.k, np.int32
        r0 = 0 if all_logits else T - 1
        rows = T - r0
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

    def tree_tables(self, parents: "tuple[int, ...]") -> TreeTables:
        """The device tables of a tree shape (made once a shape; module doc of TreeTables)."""
        key = tuple(int(p) for p in parents)
        tables = self._tree_tables.get(key)
        if tables is None:
            why = self.tree_unsupported(len(key))
            if why:
                raise ValueError(why)
            tables = self._tree_tables[key] = TreeTables(self.cp, key)
        if self._kv_ptrs is None:  # made here, not in tree_keep: no host-to-device copy inside a graph capture
            self._kv_ptrs = self.cp.asarray(np.asarray([lw[n].data.ptr for lw in self.layers for n in ("k", "v")],
                                                       np.uint64))
        return tables

    def tree_unsupported(self, T: int) -> Optional[str]:
        """Why this decoder cannot verify a tree of T rows exactly, or None."""
        if self.gemv != "tc":
            return (f"draft trees verify with the tensor-core GEMV (gemv 'tc', the exact default on compute capability "
                    f">= 8.0); this decoder runs {self.gemv!r}")
        if self.D not in (64, 128):
            return f"draft trees need a head size of 64 or 128 (attn_tree_partial_*), not {self.D}"
        if not 1 <= T <= min(TREE_MAX_ROWS, self.max_tokens):
            return f"a tree step takes 1..{min(TREE_MAX_ROWS, self.max_tokens)} rows (the exact GEMV's), got {T}"
        return None

    def tree_step(self, tables: TreeTables) -> None:
        """Enqueue one step over tokens[0:T] laid out as a tree (tables): row r at position pos + depth[r], its key
        and value cached at row pos + r, seeing the cache below pos and its own path (ancestors and itself); every
        row's logits and argmax (next_ids), no position advance. Each row is built to get a decode step's logits at
        its position after its path, bit for bit (the same products, rotation and attention order);
        tests/test_cuda_tree.py checks it (on an H100)."""
        T = tables.T
        self.k.launch("tree_positions", (1,), (32,), (self.pos, tables.depth, tables.tpos, np.int32(T)))
        self._tree = tables
        try:
            self._step(T, True, False)
        finally:
            self._tree = None

    def tree_keep(self, tables: TreeTables) -> None:
        """After tree_accept wrote tables.path: the accepted rows' keys and values (every layer) and final hidden
        states (xn) moved to the rows they now hold, then the position advanced past them (tree_advance)."""
        i32 = np.int32
        self.k.launch("tree_keep", (2 * self.L + 1, self.Hkv), (128,),
                      (self._kv_ptrs, i32(2 * self.L), self.pos, tables.path, i32(self.Hkv), i32(self.max_len),
                       i32(self.D), self.xn, i32(self.H)))
        self.k.launch("tree_advance", (1,), (1,), (self.pos, self.tokens, self.spec_out))

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

    def prefill(self, prompt: List[int], chunk: Optional[int] = None, after_chunk: Any = None) -> int:
        """Run the prompt from position 0; returns the greedy next token. after_chunk(s, m), when given, is
        called after each chunk of m tokens from prompt index s is enqueued (a draft head reads the chunk's
        final normed hidden states, xn[0:m], on the same stream)."""
        self.set_position(0)
        chunk = chunk or self.max_tokens
        for s in range(0, len(prompt), chunk):
            part = prompt[s:s + chunk]
            self.run(part, all_logits=False, advance=True)
            if after_chunk is not None:
                after_chunk(s, len(part))
        self.stream.synchronize()
        return int(self.tokens[:1].get()[0])

    def fill_cache(self, prompt: List[int], after_chunk: Any = None) -> None:
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
        eager prefill of another chunk size (3 of 20 GSM8K target texts in round 10). after_chunk(s, m): as in
        prefill (xn[0:m] holds the chunk's real rows' final normed hidden states)."""
        B = self.max_tokens
        self.set_position(0)
        for s in range(0, len(prompt), B):
            part = [int(t) for t in prompt[s:s + B]]  # a list (padding below concatenates)
            if s + B <= self.max_len:
                self.run(part + part[-1:] * (B - len(part)), all_logits=False, advance=True, graph=True)
            else:
                self.run(part, all_logits=False, advance=True)
            if after_chunk is not None:
                after_chunk(s, len(part))
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
