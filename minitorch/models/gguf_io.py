"""GGUF reading (via the `gguf` package): config, tokenizer metadata and dequantized float32 weights.

Layout facts (checked against transformers' own GGUF loader, modeling_gguf_pytorch_utils.py):
  * GGUF lists tensor dims fastest-first (`tensor.shape` = [in, out]); the dequantized numpy array is
    already (out, in) = the Hugging Face layout, so no transpose is needed;
  * for the qwen2 architecture llama.cpp uses NEOX-style (rotate_half) rotary embeddings, so unlike
    llama q/k weights are NOT permuted (transformers uses the plain TensorProcessor for qwen2);
  * `output.weight` absent means tied embeddings (transformers: tie_word_embeddings = no output.weight).

The first load dequantizes every tensor once and stores float32 `.npy` files plus config.json and
tokenizer.json in the cache folder; later loads memory-map them (np.load(mmap_mode='r')).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, Union

import numpy as np

from .config import Qwen2Config
from .errors import ModelLoadError

# GGUF tensor name -> HF checkpoint name (per-layer names use {i}).
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(.+)$")

# Quantization types we dequantize (all have numpy dequantizers in gguf.quants).
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")

CACHE_FORMAT = 1  # bump when the cached layout changes


def gguf_to_hf_name(name: str) -> Optional[str]:
    """HF checkpoint key for a GGUF tensor name, or None if it is not part of a Qwen2 model."""
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _LAYER_RE.match(name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    return None


def open_gguf(path: Union[str, Path]) -> Any:  # a gguf.GGUFReader
    """Open a GGUF file; a missing, corrupt or truncated file is one ModelLoadError naming it."""
    from gguf import GGUFReader

    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"missing GGUF file {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelLoadError(f"{path} is not a GGUF file (bad magic {magic!r})")
    try:
        reader = GGUFReader(str(path), "r")
    except Exception as e:  # gguf raises ValueError/IndexError/... on truncated or corrupt data
        raise ModelLoadError(f"corrupt or truncated GGUF file {path}: {_first_line(e)}") from None
    size = path.stat().st_size
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size:
            raise ModelLoadError(f"truncated GGUF file {path}: tensor {t.name} runs past the end of the file")
    return reader


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__


def field_value(reader: Any, key: str, default: Any = None) -> Any:
    """A metadata value (str / number / list) or `default` when absent."""
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def config_from_gguf(reader: Any, path: Union[str, Path] = "") -> Qwen2Config:
    """Qwen2Config from GGUF metadata (keys `qwen2.*`, as transformers' GGUF_CONFIG_MAPPING reads them)."""
    arch = field_value(reader, "general.architecture")
    if arch != "qwen2":
        raise ModelLoadError(f"GGUF file {path} has architecture {arch!r}; only 'qwen2' is supported")
    names = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in names:
        raise ModelLoadError(f"GGUF file {path} has no token_embd.weight tensor")
    vocab_rows = int(names["token_embd.weight"].shape[-1])  # GGUF shape [hidden, vocab]
    eos = field_value(reader, "tokenizer.ggml.eos_token_id")
    bos = field_value(reader, "tokenizer.ggml.bos_token_id")
    try:
        d = {
            "vocab_size": vocab_rows,
            "hidden_size": field_value(reader, "qwen2.embedding_length"),
            "intermediate_size": field_value(reader, "qwen2.feed_forward_length"),
            "num_hidden_layers": field_value(reader, "qwen2.block_count"),
            "num_attention_heads": field_value(reader, "qwen2.attention.head_count"),
            "num_key_value_heads": field_value(reader, "qwen2.attention.head_count_kv"),
            "rope_theta": float(field_value(reader, "qwen2.rope.freq_base", 10000.0)),
            "rms_norm_eps": float(field_value(reader, "qwen2.attention.layer_norm_rms_epsilon", 1e-6)),
            "max_position_embeddings": field_value(reader, "qwen2.context_length", 32768),
            "tie_word_embeddings": "output.weight" not in names,
            "bos_token_id": None if bos is None else int(bos),
            "eos_token_id": None if eos is None else int(eos),
        }
        missing = [k for k, v in d.items() if v is None and not k.endswith("token_id")]
        if missing:
            raise ModelLoadError(f"GGUF file {path} lacks metadata for {', '.join(missing)}")
        return Qwen2Config.from_dict(d)
    except (TypeError, ValueError) as e:
        if isinstance(e, ModelLoadError):
            raise
        raise ModelLoadError(f"bad qwen2 metadata in GGUF file {path}: {_first_line(e)}") from None


def dequantize_tensor(tensor: Any, path: Union[str, Path] = "") -> np.ndarray:
    """float32 array in HF layout (out, in) for one GGUF tensor; unsupported types raise ModelLoadError."""
    from gguf import quants

    qtype = tensor.tensor_type.name
    if qtype not in SUPPORTED_TYPES:
        raise ModelLoadError(
            f"GGUF file {path}: tensor {tensor.name} has unsupported quantization type {qtype} "
            f"(supported: {', '.join(SUPPORTED_TYPES)})"
        )
    shape = tuple(int(s) for s in reversed(tensor.shape))  # GGUF dims are fastest-first
    try:
        if qtype == "F32":
            arr = np.asarray(tensor.data, dtype=np.float32)
        elif qtype == "F16":
            arr = np.asarray(tensor.data).astype(np.float32)
        else:
            arr = quants.dequantize(tensor.data, tensor.tensor_type)
    except Exception as e:  # malformed block data
        raise ModelLoadError(f"GGUF file {path}: cannot dequantize {tensor.name} ({qtype}): {_first_line(e)}") from None
    return np.ascontiguousarray(arr, dtype=np.float32).reshape(shape)


def cache_key(path: Union[str, Path]) -> str:
    """Folder name for a GGUF's dequantized cache: file stem + hash of (absolute path, size, mtime)."""
    p = Path(path).resolve()
    st = p.stat()
    h = hashlib.sha1(f"{p}|{st.st_size}|{st.st_mtime_ns}|{CACHE_FORMAT}".encode()).hexdigest()[:12]
    return f"{p.stem}-{h}"


def dequant_cache_dir(path: Union[str, Path], cache_dir: Optional[Union[str, Path]] = None) -> Path:
    """Where the dequantized float32 copy of GGUF `path` lives (may not exist yet)."""
    from .registry import cache_root

    return cache_root(cache_dir) / "dequant" / cache_key(path)


def build_dequant_cache(
    path: Union[str, Path], out_dir: Path, progress: bool = True
) -> None:
    """Dequantize every tensor of GGUF `path` into `out_dir` (weights/*.npy, config.json, tokenizer files).

    Written into a temporary sibling folder and renamed at the end, so an interrupted run leaves no
    half-built cache behind.
    """
    with building_folder(out_dir, "config.json") as tmp:
        fill_cache_folder(path, tmp, progress, "dequantizing")


def fill_cache_folder(path: Union[str, Path], folder: Path, progress: bool, verb: str,
                      store: Optional[Callable[[Any, str, Path], Optional[dict]]] = None) -> dict[str, dict]:
    """Write every tensor of GGUF `path` into `folder` (config.json, tokenizer files, weights/{name}.npy
    as float32). `store(tensor, name, folder)` may save a tensor its own way instead and return a manifest
    entry for it (None: not handled, saved as float32). Returns {name: entry} of the stored tensors."""
    from tqdm import tqdm

    path = Path(path)
    reader = open_gguf(path)
    config = config_from_gguf(reader, path)
    (folder / "weights").mkdir()
    seen, stored = set(), {}
    for t in tqdm(reader.tensors, desc=f"{verb} {path.name}", disable=not progress, leave=False):
        name = gguf_to_hf_name(t.name)
        if name is None:
            continue  # e.g. rope_freqs: not used by Qwen2
        seen.add(name)
        entry = store(t, name, folder) if store is not None else None
        if entry is not None:
            stored[name] = entry
        else:
            np.save(folder / "weights" / f"{name}.npy", dequantize_tensor(t, path))
    _check_complete(seen, config, path)
    (folder / "config.json").write_text(json.dumps(config.to_dict(), indent=2))
    tokenizer_files_from_gguf(reader, folder)
    return stored


@contextmanager
def building_folder(out_dir: Path, done_file: str) -> Iterator[Path]:
    """A temporary sibling of out_dir to fill; renamed to out_dir when the block ends without an error,
    so an interrupted build leaves no half-built cache. If another process finished out_dir first
    (its done_file exists), theirs is kept; a stale out_dir without done_file is replaced."""
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if (out_dir / done_file).is_file():
            return
        if out_dir.exists():
            shutil.rmtree(out_dir)
        try:
            os.replace(tmp, out_dir)
        except OSError:
            if not (out_dir / done_file).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def expected_weight_names(config: Qwen2Config) -> list[str]:
    """Every checkpoint key a Qwen2 model with `config` needs."""
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not config.tie_word_embeddings:
        names.append("lm_head.weight")
    for i in range(config.num_hidden_layers):
        names += [f"model.layers.{i}.{v}" for v in _LAYER_NAMES.values()]
    return names


def _check_complete(seen: set[str], config: Qwen2Config, path: Union[str, Path]) -> None:
    missing = [n for n in expected_weight_names(config) if n not in seen]
    if missing:
        raise ModelLoadError(f"GGUF file {path} lacks tensor(s) {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")


def load_gguf_weights(
    path: Union[str, Path], cache_dir: Optional[Union[str, Path]] = None, progress: bool = True
) -> tuple[Qwen2Config, dict[str, np.ndarray], Path]:
    """(config, {hf_name: float32 array (memory-mapped)}, folder with tokenizer files) for GGUF `path`."""
    out_dir = dequant_cache_dir(path, cache_dir)
    if not (out_dir / "config.json").is_file():
        build_dequant_cache(path, out_dir, progress)
    config = Qwen2Config.from_json(out_dir / "config.json")
    weights = load_cached_arrays(out_dir)
    _check_complete(set(weights), config, out_dir)
    return config, weights, out_dir


def load_cached_arrays(out_dir: Path) -> dict[str, np.ndarray]:
    """{name: memory-mapped array} for out_dir/weights/{name}.npy (a dequantized or a packed cache)."""
    weights = {}
    for f in sorted((out_dir / "weights").glob("*.npy")):
        try:
            weights[f.name[: -len(".npy")]] = np.load(f, mmap_mode="r")
        except (ValueError, OSError) as e:
            raise ModelLoadError(f"corrupt cached weight {f} ({_first_line(e)}); delete {out_dir} and reload") from None
    return weights


# ---- the tokenizer files of a GGUF (tokenizer.py loads them; GGUF reading stays in this file) ----

# Qwen2's pre-tokenizer split (transformers models/qwen2/tokenization_qwen2.py PRETOKENIZE_REGEX).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GGUF_PRE_TOKENIZERS = {"qwen2": QWEN2_SPLIT, "deepseek-r1-qwen": QWEN2_SPLIT}
_CONTROL, _USER_DEFINED, _UNUSED = 3, 4, 5  # llama.cpp token types


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (the ByteLevel alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def tokenizer_files_from_gguf(reader: Any, out_dir: Union[str, Path]) -> None:
    """Write tokenizer.json and tokenizer_config.json for the tokenizer that GGUF `reader` describes."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer


    out_dir = Path(out_dir)
    path = getattr(reader, "data", None)
    path = getattr(path, "filename", "") or "GGUF file"
    kind = field_value(reader, "tokenizer.ggml.model")
    pre = field_value(reader, "tokenizer.ggml.pre")
    if kind != "gpt2":
        raise ModelLoadError(f"{path}: tokenizer model {kind!r} is not supported (byte-level BPE 'gpt2' only)")
    if pre not in GGUF_PRE_TOKENIZERS:
        raise ModelLoadError(f"{path}: pre-tokenizer {pre!r} is not supported ({', '.join(GGUF_PRE_TOKENIZERS)})")
    tokens = list(field_value(reader, "tokenizer.ggml.tokens", []))
    types = list(field_value(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = list(field_value(reader, "tokenizer.ggml.merges", []))
    if not tokens or not merges:
        raise ModelLoadError(f"{path}: GGUF metadata lacks tokenizer.ggml.tokens or tokenizer.ggml.merges")

    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {
        (t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))): i for i, t in enumerate(tokens)
    }
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges], dropout=None, unk_token=None,
                     continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False, byte_fallback=False)
    tk = HFTokenizer(bpe)
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(GGUF_PRE_TOKENIZERS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tk.decoder = decoders.ByteLevel()
    control = [t for t, ty in zip(tokens, types) if ty == _CONTROL and set(t) <= alphabet]
    tk.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    user = [t for t, ty in zip(tokens, types) if ty == _USER_DEFINED and t in vocab]
    tk.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])
    tk.save(str(out_dir / "tokenizer.json"))

    real_size = len(tokens)
    while real_size > 0 and types[real_size - 1] == _UNUSED:  # trailing [PAD...] rows pad the embedding
        real_size -= 1

    def tok_name(key: str) -> Optional[str]:
        i = field_value(reader, f"tokenizer.ggml.{key}")
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    tcfg = {
        "chat_template": field_value(reader, "tokenizer.chat_template"),
        "bos_token": tok_name("bos_token_id"),
        "eos_token": tok_name("eos_token_id"),
        "pad_token": tok_name("padding_token_id"),
        "unk_token": tok_name("unknown_token_id"),
        "minitorch_vocab_size": real_size,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2, ensure_ascii=False))
