"""Python launchers for kernels/*.cu: shape checks, launch geometry, dtype dispatch.

Each launcher takes "views": any object with `storage` (a 1-D CuPy array: float32, int64, or uint16
holding bf16 bits), `shape`, `strides` (elements) and `dtype` ("float32" | "bfloat16" | "int64") --
the core's TensorData, or `View` below. The fused launchers need contiguous operands; the
map / zip / cast / reduce launchers take any strides and broadcast. Used by CudaOps (ops.py),
the graph-captured decoder (decoder.py) and the GPU tests.
"""
from __future__ import annotations

import math
from typing import Any, Dict, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from .runtime import get_cupy, kernels

SFX = {"float32": "f32", "bfloat16": "bf16", "int64": "i64"}
CUPY_DTYPES = {"float32": np.float32, "bfloat16": np.uint16, "int64": np.int64}
MAP_OPS = {"id": 0, "neg": 1, "inv": 2, "exp": 3, "log": 4, "sqrt": 5, "rsqrt": 6, "sigmoid": 7,
           "relu": 8, "silu": 9, "tanh": 10, "abs": 11, "square": 12}
ZIP_OPS = {"add": 0, "sub": 1, "mul": 2, "div": 3, "pow": 4, "lt": 5, "gt": 6, "eq": 7, "max": 8,
           "min": 9, "relu_back": 10, "log_back": 11, "inv_back": 12, "ne": 13}
COMPARISONS = {"lt", "gt", "eq", "ne"}
REDUCE_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3}
THREADS = 256
MAX_GRID = 65535 * 16
REDUCE_CHUNK = 8192  # elements a warp reduces in pass 1 of a two-pass reduction (_reduce_two_pass)
REDUCE_TWO_PASS = 4 * REDUCE_CHUNK  # float32 reductions of < 512 outputs over at least this many elements


class View(NamedTuple):
    """A strided window on a 1-D CuPy storage array (the fields kernels need)."""
    storage: Any
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]
    dtype: str


def contiguous_strides(shape: Sequence[int]) -> Tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


def view_of(arr: Any, dtype: Optional[str] = None) -> View:
    """A View over a contiguous CuPy array of any shape (bf16 = uint16 storage)."""
    if dtype is None:
        dtype = {"float32": "float32", "int64": "int64", "uint16": "bfloat16"}[str(arr.dtype)]
    return View(arr.reshape(-1), tuple(arr.shape), contiguous_strides(arr.shape), dtype)


def empty(shape: Sequence[int], dtype: str) -> View:
    """A fresh contiguous View of `shape`."""
    cp = get_cupy()
    n = int(np.prod(shape)) if len(shape) else 1
    return View(cp.empty(max(n, 1), dtype=CUPY_DTYPES[dtype]), tuple(shape), contiguous_strides(shape), dtype)


def ptr(v: Any) -> np.uint64:
    """Device address of a view's storage start, as a kernel argument."""
    return np.uint64(v.storage.data.ptr)


def is_contiguous(v: Any) -> bool:
    acc = 1
    for s, st in zip(reversed(v.shape), reversed(v.strides)):
        if s != 1 and st != acc:
            return False
        acc *= s
    return True


def _size(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _grid(n: int) -> Tuple[int]:
    return (max(1, min((n + THREADS - 1) // THREADS, MAX_GRID)),)


def _bcast_strides(v: Any, out_shape: Tuple[int, ...]) -> Tuple[int, ...]:
    k = len(out_shape) - len(v.shape)
    if k < 0:
        raise ValueError(f"cannot broadcast shape {v.shape} to {out_shape}")
    res = [0] * len(out_shape)
    for i, (s, st) in enumerate(zip(v.shape, v.strides)):
        o = out_shape[k + i]
        if s == o:
            res[k + i] = st if s != 1 else 0
        elif s != 1:
            raise ValueError(f"cannot broadcast shape {v.shape} to {out_shape}")
    return tuple(res)


_meta_cache: Dict[Tuple[Any, ...], Any] = {}


def _meta(shape: Tuple[int, ...], *strides: Tuple[int, ...]) -> Any:
    """Device int64 array [nd, shape, strides...] (cached: uploaded once per layout)."""
    key = (shape,) + strides
    m = _meta_cache.get(key)
    if m is None:
        cp = get_cupy()
        host = np.array([len(shape), *shape, *[s for st in strides for s in st]], dtype=np.int64)
        if len(_meta_cache) > 4096:
            _meta_cache.clear()
        m = _meta_cache[key] = cp.asarray(host)
    return m


def _check_dtype(v: Any, allowed: Sequence[str], what: str) -> str:
    if v.dtype not in allowed:
        raise TypeError(f"{what}: dtype {v.dtype} not supported on CUDA (supported: {', '.join(allowed)})")
    return v.dtype


# ---------------------------------------------------------------- generic elementwise / reductions
def map_op(op: str, a: Any, out: Any) -> None:
    """out = op(a), a broadcast to out.shape; same dtype in and out."""
    if a.dtype != out.dtype:
        raise TypeError(f"map {op}: input dtype {a.dtype} != output dtype {out.dtype} (cast first)")
    sfx = SFX[_check_dtype(a, SFX, f"map {op}")]
    n = _size(out.shape)
    if n == 0:
        return
    code = np.int32(MAP_OPS[op])
    if a.shape == out.shape and is_contiguous(a) and is_contiguous(out):
        kernels().launch(f"map_contig_{sfx}", _grid(n), (THREADS,), (ptr(a), ptr(out), np.int64(n), code))
        return
    meta = _meta(out.shape, out.strides, _bcast_strides(a, out.shape))
    kernels().launch(f"map_{sfx}", _grid(n), (THREADS,), (ptr(a), ptr(out), meta, np.int64(n), code))


def zip_op(op: str, a: Any, b: Any, out: Any) -> None:
    """out = op(a, b) with broadcasting; a and b share a dtype; comparisons may write float32."""
    if a.dtype != b.dtype:
        raise TypeError(f"zip {op}: operand dtypes differ ({a.dtype}, {b.dtype}); cast first")
    dt = _check_dtype(a, SFX, f"zip {op}")
    if out.dtype == dt:
        name = f"zip_{SFX[dt]}"
    elif out.dtype == "float32" and dt in ("bfloat16", "int64"):
        name = f"zip_{SFX[dt]}_f32"
    else:
        raise TypeError(f"zip {op}: cannot write {dt} x {dt} -> {out.dtype}")
    n = _size(out.shape)
    if n == 0:
        return
    code = np.int32(ZIP_OPS[op])
    if (dt != "int64" and a.shape == out.shape and b.shape == out.shape and is_contiguous(a)
            and is_contiguous(b) and is_contiguous(out)):
        kernels().launch(name.replace("zip_", "zip_contig_"), _grid(n), (THREADS,),
                         (ptr(a), ptr(b), ptr(out), np.int64(n), code))
        return
    meta = _meta(out.shape, out.strides, _bcast_strides(a, out.shape), _bcast_strides(b, out.shape))
    kernels().launch(name, _grid(n), (THREADS,), (ptr(a), ptr(b), ptr(out), meta, np.int64(n), code))


def cast(a: Any, out: Any) -> None:
    """out[...] = a (broadcast to out.shape), converting dtype; out may be any strided view."""
    n = _size(out.shape)
    if n == 0:
        return
    name = f"cast_{SFX[_check_dtype(a, SFX, 'copy')]}_{SFX[_check_dtype(out, SFX, 'copy')]}"
    meta = _meta(out.shape, out.strides, _bcast_strides(a, out.shape))
    kernels().launch(name, _grid(n), (THREADS,), (ptr(a), ptr(out), meta, np.int64(n)))


def where(c: Any, a: Any, b: Any, out: Any) -> None:
    """out = c != 0 ? a : b with broadcasting; c float32, a/b/out one dtype."""
    if c.dtype != "float32" or a.dtype != b.dtype or a.dtype != out.dtype:
        raise TypeError(f"where: condition must be float32 and values one dtype, got {c.dtype}, {a.dtype}, "
                        f"{b.dtype} -> {out.dtype}")
    n = _size(out.shape)
    if n == 0:
        return
    meta = _meta(out.shape, out.strides, _bcast_strides(c, out.shape), _bcast_strides(a, out.shape),
                 _bcast_strides(b, out.shape))
    kernels().launch(f"where_{SFX[a.dtype]}", _grid(n), (THREADS,), (ptr(c), ptr(a), ptr(b), ptr(out), meta, np.int64(n)))


def fill(out: Any, value: float) -> None:
    """Fill a contiguous view with a scalar."""
    n = _size(out.shape)
    if n == 0:
        return
    if not is_contiguous(out):
        raise ValueError("fill needs a contiguous view")
    dt = out.dtype
    v = np.int64(value) if dt == "int64" else np.float32(value)
    kernels().launch(f"fill_{SFX[dt]}", _grid(n), (THREADS,), (ptr(out), np.int64(n), v))


def reduce(op: str, a: Any, dim: int, out: Any) -> None:
    """out (a.shape with shape[dim] = 1, any strides) = reduction of a along dim."""
    sfx = SFX[_check_dtype(a, SFX, f"reduce {op}")]
    if out.dtype != a.dtype:
        raise TypeError(f"reduce {op}: output dtype {out.dtype} != input dtype {a.dtype}")
    oshape = tuple(1 if i == dim else s for i, s in enumerate(a.shape))
    if tuple(out.shape) != oshape:
        raise ValueError(f"reduce {op}: out shape {out.shape} should be {oshape}")
    nout, R = _size(oshape), a.shape[dim]
    if nout == 0:
        return
    meta = _meta(oshape, out.strides, tuple(a.strides))
    args = (ptr(a), ptr(out), meta, np.int64(nout), np.int64(R), np.int64(a.strides[dim]),
            np.int32(REDUCE_OPS[op]))
    if nout < 512 and R >= REDUCE_TWO_PASS and a.dtype == "float32":
        _reduce_two_pass(op, a, dim, out, R)
    elif nout < 512 and R > 2048:
        kernels().launch(f"reduce_block_{sfx}", (min(nout, MAX_GRID),), (THREADS,), args)
    else:
        kernels().launch(f"reduce_warp_{sfx}", _grid(nout * 32), (THREADS,), args)


def _reduce_two_pass(op: str, a: Any, dim: int, out: Any, R: int) -> None:
    """reduce() of few outputs over a long float32 dim in two passes: one block per output would run a whole
    sum of 10^8 elements (the training loss's) on one SM for a second. Pass 1 reduces chunks of REDUCE_CHUNK
    elements (one warp each, thousands at once) into a float32 buffer of partials, the remainder's own partial
    last; pass 2 reduces the partials. Fixed chunks, no atomics: the same bits every run."""
    c = REDUCE_CHUNK
    P, rem = R // c, R % c
    rs = a.strides[dim]
    oshape = tuple(1 if i == dim else s for i, s in enumerate(a.shape))
    parts = empty(oshape[:dim] + (P + (rem > 0),) + oshape[dim + 1:], "float32")
    pst = parts.strides
    # pass 1: a's first P * c elements along dim seen as (P, c), reduced over c into parts[..., :P, ...]
    shape = a.shape[:dim] + (P, c) + a.shape[dim + 1:]
    strides = a.strides[:dim] + (c * rs, rs) + a.strides[dim + 1:]
    reduce(op, View(a.storage, shape, strides, a.dtype), dim + 1,
           View(parts.storage, shape[:dim + 1] + (1,) + shape[dim + 2:], pst[:dim + 1] + (1,) + pst[dim + 1:],
                "float32"))
    if rem:  # the remainder's partial into parts[..., P, ...]
        tail = View(a.storage[P * c * rs:], a.shape[:dim] + (rem,) + a.shape[dim + 1:], a.strides, a.dtype)
        reduce(op, tail, dim, View(parts.storage[P * pst[dim]:], oshape, pst, "float32"))
    reduce(op, parts, dim, out)  # pass 2


def resnorm_rows(k: Any, resid: Any, w: Any, xn: Any, T: int, H: int, eps: float) -> None:
    """xn = RMSNorm(resid) * w (bf16) for T rows of the fp32 residual (H wide) through launcher k, a block a row
    (kernels/gemv.cu gemv_resnorm_rows_bf16: the resnorm epilogue's row function at its block size, so its bits).
    CudaDecoder's steps of StepPlan.split_norm and the batch decoder's steps normalise their rows with it."""
    k.launch("gemv_resnorm_rows_bf16", (T,), (256,), (resid, w, xn, np.int32(H), np.float32(eps)))


def argmax_plan(n: int) -> Tuple[int, int]:
    """(nchunks, chunk) for the two-phase argmax of rows of length n."""
    nchunks = max(1, min(128, n // 2048))
    return nchunks, -(-n // nchunks)


def argmax_rows(x: Any, out: Any, ws: Optional[Tuple[Any, Any]] = None) -> None:
    """out (rows,) int64 = argmax over the last dim of contiguous x (rows, n); NaN wins, ties go
    to the lowest index. ws: optional preallocated (float32, int32) workspaces of rows*nchunks."""
    sfx = SFX[_check_dtype(x, ("float32", "bfloat16"), "argmax")]
    if not is_contiguous(x) or out.dtype != "int64" or not is_contiguous(out):
        raise ValueError("argmax_rows needs contiguous x and a contiguous int64 out")
    n = x.shape[-1]
    rows = _size(x.shape) // max(n, 1)
    if rows == 0:
        return
    nchunks, chunk = argmax_plan(n)
    if ws is None:
        cp = get_cupy()
        ws = (cp.empty(rows * nchunks, cp.float32), cp.empty(rows * nchunks, cp.int32))
    kernels().launch(f"argmax_partial_{sfx}", (nchunks, rows), (256,), (ptr(x), ws[0], ws[1], np.int32(n), np.int32(chunk)))
    kernels().launch("argmax_final", (rows,), (128,), (ws[0], ws[1], ptr(out), np.int32(nchunks)))


# ---------------------------------------------------------------- fused row ops
def _rows(x: Any, what: str) -> Tuple[int, int]:
    if not is_contiguous(x):
        raise ValueError(f"{what} needs a contiguous input")
    n = x.shape[-1] if x.shape else 1
    return _size(x.shape) // max(n, 1), n


def _row_threads(n: int) -> int:
    return 1024 if n >= 4096 else 256


def softmax(x: Any, out: Any, log: bool = False) -> None:
    """(log-)softmax over the last dim; x, out contiguous of one shape and dtype."""
    sfx = SFX[_check_dtype(x, ("float32", "bfloat16"), "softmax")]
    rows, n = _rows(x, "softmax")
    if rows and n:
        kernels().launch(f"softmax_{sfx}", (rows,), (_row_threads(n),), (ptr(x), ptr(out), np.int32(n), np.int32(log)))


def rmsnorm(x: Any, w: Any, out: Any, eps: float) -> None:
    """RMSNorm over the last dim (fp32 accumulation)."""
    sfx = SFX[_check_dtype(x, ("float32", "bfloat16"), "rmsnorm")]
    rows, n = _rows(x, "rmsnorm")
    if w.shape[-1] != n or w.dtype != x.dtype:
        raise ValueError(f"rmsnorm: weight {w.shape} {w.dtype} does not match input {x.shape} {x.dtype}")
    if rows:
        kernels().launch(f"rmsnorm_{sfx}", (rows,), (_row_threads(n),), (ptr(x), ptr(w), ptr(out), np.int32(n), np.float32(eps)))


def layernorm(x: Any, w: Any, b: Optional[Any], out: Any, eps: float) -> None:
    """LayerNorm over the last dim (fp32 mean / variance); b may be None."""
    sfx = SFX[_check_dtype(x, ("float32", "bfloat16"), "layernorm")]
    rows, n = _rows(x, "layernorm")
    bp = ptr(b) if b is not None else np.uint64(0)
    if rows:
        kernels().launch(f"layernorm_{sfx}", (rows,), (_row_threads(n),),
                         (ptr(x), ptr(w), bp, ptr(out), np.int32(n), np.float32(eps)))


def add_rmsnorm(resid: Any, delta: Optional[Any], w: Any, out: Any, eps: float) -> None:
    """resid (fp32) += delta; out = rmsnorm(resid) * w in w's dtype."""
    sfx = SFX[w.dtype]
    rows, n = _rows(resid, "add_rmsnorm")
    dp = ptr(delta) if delta is not None else np.uint64(0)
    kernels().launch(f"add_rmsnorm_{sfx}", (rows,), (_row_threads(n),),
                     (ptr(resid), dp, ptr(w), ptr(out), np.int32(n), np.float32(eps)))


def rope(x: Any, cos: Any, sin: Any, out: Any) -> None:
    """Rotary embedding; x contiguous (..., T, D), cos/sin contiguous (T, D) of x's dtype."""
    sfx = SFX[_check_dtype(x, ("float32", "bfloat16"), "rope")]
    rows, D = _rows(x, "rope")
    T = x.shape[-2] if len(x.shape) >= 2 else 1
    if D % 2:
        raise ValueError(f"rope needs an even head dim, got {D}")
    if tuple(cos.shape[-2:]) != (T, D) or not is_contiguous(cos) or not is_contiguous(sin):
        raise ValueError(f"rope: cos/sin must be contiguous ({T}, {D}), got {cos.shape}")
    n = rows * (D // 2)
    if n:
        kernels().launch(f"rope_{sfx}", _grid(n), (THREADS,),
                         (ptr(x), ptr(cos), ptr(sin), ptr(out), np.int64(rows), np.int32(T), np.int32(D)))


def embedding(w: Any, ids: Any, out: Any) -> None:
    """out (n, D) = w[ids]; w (V, D) contiguous, ids int64 contiguous; out fp32 or w's dtype."""
    V, D = w.shape
    n = _size(ids.shape)
    if w.dtype == out.dtype:
        name = f"embedding_{SFX[w.dtype]}"
    elif out.dtype == "float32":
        name = f"embedding_{SFX[w.dtype]}_f32"
    else:
        raise TypeError(f"embedding: cannot write {w.dtype} rows as {out.dtype}")
    if n:
        kernels().launch(name, (n,), (THREADS,), (ptr(w), ptr(ids), ptr(out), np.int32(V), np.int32(D)))


def silu_mul(gate: Any, up: Any, out: Any) -> None:
    """out = silu(gate) * up, all contiguous of one shape."""
    sfx = SFX[_check_dtype(gate, ("float32", "bfloat16"), "silu_mul")]
    n = _size(gate.shape)
    if n:
        kernels().launch(f"silu_mul_{sfx}", _grid(n), (THREADS,), (ptr(gate), ptr(up), ptr(out), np.int64(n)))


def gate_up_silu(gu: Any, out: Any) -> None:
    """out (rows, I) = silu(gu[:, :I]) * gu[:, I:] for gu (rows, 2I) contiguous."""
    sfx = SFX[gu.dtype]
    rows, I2 = _rows(gu, "gate_up_silu")
    n = rows * (I2 // 2)
    kernels().launch(f"gate_up_silu_{sfx}", _grid(n), (THREADS,), (ptr(gu), ptr(out), np.int64(rows), np.int32(I2 // 2)))


# ---------------------------------------------------------------- attention
ATT_RMAX = 8
WIDE_ROWS = 8192  # products of more output rows take the kernels of more rows a block (gemvtc*w, gemvtcbw, gemv1r8, r16 i8)
ATT_SLOT_BLOCKS = 264  # attention partial blocks a decoder's step aims at (two per SM of an H200) ...
ATT_MIN_SLOTS = 32  # ... with at least this many split slots (long prefill steps have many row groups)
ATT_DMAX = 256


def attention_splits(kmax: int, blocks_base: int, sms: int = 132) -> Tuple[int, int]:
    """(KB, nsplit): keys per split (multiple of 32) so that about 2 blocks per SM are in flight."""
    want = max(1, math.ceil(2 * sms / max(blocks_base, 1)))
    kb = max(32, min(2048, 32 * math.ceil(math.ceil(kmax / want) / 32)))
    return kb, max(1, math.ceil(kmax / kb))


SAMPLE_THREADS = 512  # kernels/sampling.cu: threads a block (a row is one cluster of such blocks)
LOOKUP_THREADS = 512  # kernels/lookup.cu: threads of ngram_lookup's one block
SAMPLE_CLUSTER = 16  # blocks a row on devices with thread-block clusters (sm_90); 1 elsewhere


def cluster_supported() -> bool:
    """Whether the device runs thread-block clusters and PDL (compute capability >= 9.0)."""
    return int(get_cupy().cuda.Device().compute_capability) >= 90


def tensor_cores_supported() -> bool:
    """Whether the device runs the tensor-core GEMV (kernels/gemv.cu gemvtc*: mma.m16n8k16 with bf16
    inputs, compute capability >= 8.0)."""
    return int(get_cupy().cuda.Device().compute_capability) >= 80


ATT_FAST_HEADS = (64, 128)  # head sizes with a compact attn_partial_bf16_d<D> (kernels/attention.cu)


def attn_partial_kernel(sfx: str, D: int, k_strides: Any, v_strides: Any, k_ptr: int, v_ptr: int,
                        fast: Optional[bool] = None) -> str:
    """attn_partial_bf16_d64 / _d128 (the same bits in a fraction of the code, so a cold instruction
    cache costs less) when the head size and 16-byte aligned K/V rows allow it, else attn_partial_<sfx>.
    fast: None = when possible, False = never (tests compare the two)."""
    ok = (sfx == "bf16" and D in ATT_FAST_HEADS and all(int(s) % 8 == 0 for s in (*k_strides[:-1], *v_strides[:-1]))
          and k_ptr % 16 == 0 and v_ptr % 16 == 0)
    return f"attn_partial_bf16_d{D}" if ok and fast is not False else f"attn_partial_{sfx}"


def attention(q: Any, k: Any, v: Any, out: Any, scale: float, q_start: int,
              kb: Optional[int] = None, fast: Optional[bool] = None) -> None:
    """Causal GQA attention: q (B,Hq,T,D), k/v (B,Hkv,L,D) any strides with d contiguous,
    out (B,Hq,T,D); query t sits at q_start + t and sees keys 0..q_start+t.
    kb: keys per split (a multiple of 32) instead of the automatic choice.
    fast: whether the split path may use the compact kernel (attn_partial_kernel; same bits)."""
    sfx = SFX[_check_dtype(q, ("float32", "bfloat16"), "attention")]
    B, Hq, T, D = q.shape
    Bk, Hkv, L, Dk = k.shape
    if (Bk, Dk) != (B, D) or tuple(v.shape) != tuple(k.shape) or Hq % Hkv:
        raise ValueError(f"attention: q {q.shape}, k {k.shape}, v {v.shape} do not fit (B,Hq,T,D)/(B,Hkv,L,D)")
    if D > ATT_DMAX:
        raise ValueError(f"attention: head dim {D} > {ATT_DMAX} is not supported by the CUDA kernel")
    if L < q_start + T:
        raise ValueError(f"attention: cache holds {L} keys but queries reach position {q_start + T - 1}")
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        if t.strides[-1] != 1 and t.shape[-1] != 1:
            raise ValueError(f"attention: {name} needs a contiguous last dim")
        if t.dtype != q.dtype:
            raise TypeError(f"attention: {name} dtype {t.dtype} != q dtype {q.dtype}")
    G = Hq // Hkv
    groups = math.ceil(G * T / ATT_RMAX)
    kmax = q_start + T
    if kb is None:
        kb, nsplit = attention_splits(kmax, B * Hkv * groups)
    if kb % 32 or kb < 32:
        raise ValueError(f"attention: keys per split must be a positive multiple of 32, got {kb}")
    nsplit = max(1, math.ceil(kmax / kb))
    i64 = np.int64
    qkv_args = (i64(q.strides[0]), i64(q.strides[1]), i64(q.strides[2]), i64(k.strides[0]), i64(k.strides[1]),
                i64(k.strides[2]), i64(v.strides[0]), i64(v.strides[1]), i64(v.strides[2]))
    tail = (np.int32(Hq), np.int32(Hkv), np.int32(T), np.int32(D), np.int32(L), np.int32(kb), np.float32(scale))
    cp = get_cupy()
    rows = B * Hq * T
    ws_m = cp.empty(rows * nsplit, dtype=cp.float32)
    ws_l = cp.empty(rows * nsplit, dtype=cp.float32)
    ws_acc = cp.empty(rows * nsplit * D, dtype=cp.float32)
    name = attn_partial_kernel(sfx, D, k.strides, v.strides, ptr(k), ptr(v), fast)
    kernels().launch(
        name, (nsplit, B * Hkv, groups), (128,),
        (ptr(q), ptr(k), ptr(v), ws_m, ws_l, ws_acc, np.uint64(0), np.int32(q_start)) + qkv_args + tail
        + (np.int32(nsplit),))
    kernels().launch(
        f"attn_combine_{sfx}", (rows,), (32 * math.ceil(D / 32),),
        (ws_m, ws_l, ws_acc, ptr(out), i64(out.strides[0]), i64(out.strides[1]), i64(out.strides[2]),
         np.int32(Hq), np.int32(T), np.int32(D), np.int32(nsplit), np.uint64(0), np.int32(q_start), np.int32(L),
         np.int32(kb)))
