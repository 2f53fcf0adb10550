"""Safetensors reading for Hugging Face model folders: single file or sharded, memory-mapped, no pickle.

The safetensors format is `u64 little-endian header length | JSON header | raw little-endian data`.
The `safetensors` library validates each file (a truncated file or a bad header is refused); the
tensors themselves are then memory-mapped with numpy at the offsets the header gives, so float32
weights are used in place (zero copy) and bf16 / fp16 ones are widened to float32 when read,
one tensor at a time (LazyTensors).
numpy has no bfloat16, which is why the library's own numpy getter cannot be used for bf16 checkpoints.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Iterator, Mapping, Union

import numpy as np

from .errors import ModelLoadError

INDEX_FILE = "model.safetensors.index.json"
_NP_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64,
              "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """Widen raw bfloat16 bits (uint16) to float32 (exact: bf16 is the top half of a float32)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _validate(path: Path) -> None:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="np"):
            pass
    except Exception as e:  # SafetensorError: truncated file, bad header, ...
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"corrupt or truncated safetensors file {path}: {msg}") from None


class LazyTensors(Mapping[str, np.ndarray]):
    """name -> float32 array, converted when first read: bf16 / fp16 checkpoints are widened one tensor
    at a time, so a loader that moves each tensor to its backend never holds the whole float32 copy."""

    def __init__(self) -> None:
        self._views: dict[str, tuple[np.ndarray, str]] = {}

    def add(self, name: str, typed: np.ndarray, dtype: str) -> None:
        self._views[name] = (typed, dtype)

    def __getitem__(self, name: str) -> np.ndarray:
        typed, dtype = self._views[name]
        if dtype == "F32":
            return typed if typed.flags.aligned else np.array(typed)  # zero copy when aligned
        if dtype == "BF16":
            return bf16_to_float32(typed)
        return typed.astype(np.float32)

    def __iter__(self) -> Iterator[str]:
        return iter(self._views)

    def __len__(self) -> int:
        return len(self._views)

    def update_from(self, other: "LazyTensors") -> None:
        self._views.update(other._views)


def read_safetensors(path: Union[str, Path]) -> LazyTensors:
    """{name: float32 array} for one .safetensors file (float32 tensors are read-only memory maps)."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"missing safetensors file {path}")
    _validate(path)
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    base = 8 + n
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    out = LazyTensors()
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info["dtype"]
        if dtype not in _NP_DTYPES:
            raise ModelLoadError(f"{path}: tensor {name} has unsupported dtype {dtype}")
        start, end = info["data_offsets"]
        out.add(name, mm[base + start : base + end].view(_NP_DTYPES[dtype]).reshape(tuple(info["shape"])), dtype)
    return out


def safetensors_files(folder: Union[str, Path]) -> list[Path]:
    """The weight files of a model folder: the shards named by the index, else every *.safetensors."""
    folder = Path(folder)
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise ModelLoadError(f"malformed shard index {index}: {e}") from None
        files = []
        for shard in dict.fromkeys(weight_map.values()):  # ordered, unique
            p = folder / shard
            if not p.is_file():
                raise ModelLoadError(f"missing shard {p} (listed in {index})")
            files.append(p)
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no *.safetensors weights in {folder}")
    return files


def load_safetensors_folder(folder: Union[str, Path]) -> LazyTensors:
    """Every tensor of a model folder as float32 arrays (converted on access) keyed by checkpoint name."""
    weights = LazyTensors()
    for f in safetensors_files(folder):
        weights.update_from(read_safetensors(f))
    return weights
