"""Where the limit is for a CPU decode: the bytes one decode token reads, and this box's streaming read
bandwidth. Decoding one token is a pass over every weight the forward touches, so tokens/s can at most
be bandwidth / bytes per token; `share` says how much of that bound a measured tokens/s reaches.

Bytes per token (weights, then the KV cache separately):
  ours       model_bytes_per_token(model): every parameter a one-token forward reads, as held in
             memory. A PackedWeight is the sum of its five tiled arrays (PackedWeight.tiles: qt, sc, d,
             m, dmin; minitorch/packed.py), padding rows of the last tile included, since the kernel
             streams them; a float tensor (norms, biases, float weights) is size x itemsize. The token
             embedding contributes one row (its bytes / its padded row count), unless the model has no
             lm_head (tied): then the vocabulary projection reads the whole table, counted once.
  llama.cpp  gguf_bytes_per_token(path): the GGUF file's tensor bytes (as llama.cpp mmaps and reads
             them), all tensors except token_embd.weight, which contributes one row, unless the file has
             no output.weight (tied): then token_embd is read whole, once.
  KV cache   kv_bytes_per_token(layers, kv_heads, head_dim, context, itemsize): K and V of every layer at
             `context` positions (ours float32: 4 bytes; llama.cpp's default f16 cache: 2).
A verify pass over gamma + 1 rows reads the same weight bytes as one token (each row reuses them).

Bandwidth: stream_bandwidth(), numba prange kernels over arrays of a few hundred MB (far past the
caches), best of several repeats: `read` sums one float32 array (bytes read / s), `copy` copies one
array into another (bytes read + bytes written / s, STREAM's convention; write-allocate traffic is not
counted). The read figure is the bound for decoding, which only reads weights.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit, prange

CHUNKS = 256  # slices per kernel call (prange spreads them over the threads)
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int8": 1}


# ------------------------------------------------------------------------------------------ bytes / token

def param_bytes(name: str, value: Any) -> int:
    """Bytes held by one parameter value: a PackedWeight's tiled arrays, else size x itemsize."""
    from minitorch.packed import PackedWeight

    if isinstance(value, PackedWeight):
        return int(sum(a.nbytes for a in value.tiles))
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    return int(value.size) * ITEMSIZE.get(str(value.dtype), 4)


def embedding_row_bytes(value: Any) -> int:
    """Bytes of one row of an embedding table (a packed table: its bytes over its padded row count)."""
    from minitorch.packed import TILE, PackedWeight

    if isinstance(value, PackedWeight):
        return param_bytes("", value) // (value.qt.shape[0] * TILE)
    return param_bytes("", value) // int(value.shape[0])


def model_bytes_per_token(model: Any) -> int:
    """Weight bytes a one-token forward of our Qwen2ForCausalLM reads (module doc)."""
    tied = model.lm_head is None
    total = 0
    for name, p in model.named_parameters():
        if name == "model.embed_tokens.weight" and not tied:
            total += embedding_row_bytes(p.value)
        else:
            total += param_bytes(name, p.value)
    return total


def gguf_bytes_per_token(path: str | Path) -> int:
    """Tensor bytes of a GGUF file that llama.cpp reads for one token (module doc)."""
    from gguf import GGUFReader

    tensors = {t.name: t for t in GGUFReader(str(path)).tensors}
    total = sum(int(t.n_bytes) for name, t in tensors.items() if name != "token_embd.weight")
    emb = tensors.get("token_embd.weight")
    if emb is not None:
        if "output.weight" in tensors:
            rows = int(emb.shape[-1]) if len(emb.shape) > 1 else 1  # GGUF shapes are (K, N): N rows
            total += int(emb.n_bytes) // rows
        else:
            total += int(emb.n_bytes)
    return total


def gguf_attention_shape(path: str | Path) -> tuple[int, int, int]:
    """(layers, kv heads, head dim) from a GGUF file's metadata."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))

    def field(suffix: str) -> int | None:
        for key, f in r.fields.items():
            if key.endswith(suffix) and f.data:
                return int(f.parts[f.data[0]][0])
        return None

    layers, heads, kv = field(".block_count"), field(".attention.head_count"), field(".attention.head_count_kv")
    width, key_len = field(".embedding_length"), field(".attention.key_length")
    if layers is None or heads is None or width is None:
        raise ValueError(f"GGUF file {path} lacks block_count / head_count / embedding_length")
    return layers, kv or heads, key_len or width // heads


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, context: float, itemsize: int) -> int:
    """Bytes of K and V one token's attention reads at `context` cached positions."""
    return int(2 * layers * kv_heads * head_dim * context * itemsize)


def share(tokens_per_s: float, bytes_per_token: float, bandwidth: float) -> float:
    """tokens/s x bytes/token / bandwidth: the fraction of the bandwidth bound reached."""
    return tokens_per_s * bytes_per_token / bandwidth


# ------------------------------------------------------------------------------------------ bandwidth

@njit(fastmath=True, cache=True)
def _chunk_sum(a: np.ndarray) -> float:
    s = np.float32(0.0)  # float32 with fastmath: LLVM vectorizes it into independent lanes
    for i in range(a.size):
        s += a[i]
    return s


@njit(parallel=True, cache=True)
def _read_sum(a: np.ndarray, chunks: int) -> float:
    n = a.size
    step = (n + chunks - 1) // chunks
    parts = np.zeros(chunks, dtype=np.float64)
    for c in prange(chunks):
        parts[c] = _chunk_sum(a[c * step:min(n, (c + 1) * step)])
    return parts.sum()


@njit(cache=True)
def _chunk_copy(src: np.ndarray, dst: np.ndarray) -> None:
    for i in range(src.size):
        dst[i] = src[i]


@njit(parallel=True, cache=True)
def _copy(src: np.ndarray, dst: np.ndarray, chunks: int) -> None:
    n = src.size
    step = (n + chunks - 1) // chunks
    for c in prange(chunks):
        lo, hi = c * step, min(n, (c + 1) * step)
        _chunk_copy(src[lo:hi], dst[lo:hi])


def read_sum(a: np.ndarray, chunks: int = 256) -> float:
    """Sum of a float32 array by the bandwidth kernel: float32 sums of `chunks` slices (vectorized), added
    in float64 (so rounding is that of a float32 sum over one slice)."""
    return float(_read_sum(np.ascontiguousarray(a, dtype=np.float32).reshape(-1), chunks))


def stream_bandwidth(nbytes: int = 512 << 20, threads: int | None = None, repeats: int = 5,
                     copy: bool = True) -> dict[str, float]:
    """Best-of-`repeats` GB/s of the read kernel over an nbytes float32 array and (copy=True) of the copy
    kernel over two nbytes / 2 arrays, on `threads` numba threads (None: numba's current setting).
    Returns {"read": GB/s, "copy": GB/s (absent without copy), "sum_ok": the read kernel's sum check}."""
    import numba

    old = numba.get_num_threads()
    if threads is not None:
        numba.set_num_threads(min(int(threads), numba.config.NUMBA_NUM_THREADS))
    try:
        n = max(nbytes // 4, 1)
        a = np.ones(n, dtype=np.float32)
        _read_sum(a[:1024], CHUNKS)  # compile / load from cache before timing
        best, total = float("inf"), 0.0
        for _ in range(repeats):
            t0 = time.perf_counter()
            total = _read_sum(a, CHUNKS)
            best = min(best, time.perf_counter() - t0)
        out = {"read": a.nbytes / best / 1e9, "sum_ok": float(total == n)}
        del a
        if copy:
            src = np.ones(max(n // 2, 1), dtype=np.float32)
            dst = np.empty_like(src)
            _copy(src[:1024], dst[:1024], CHUNKS)
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                _copy(src, dst, CHUNKS)
                best = min(best, time.perf_counter() - t0)
            out["copy"] = 2 * src.nbytes / best / 1e9
        return out
    finally:
        numba.set_num_threads(old)
