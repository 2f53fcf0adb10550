"""A draft head's files: head.safetensors (its weights) + head.json (DraftHeadConfig, with the fingerprint of the
target it was trained for). `save_head` writes both, each whole or not at all; `load_head` refuses a missing,
corrupt or other target's head with a ModelLoadError that names it.

Weights are stored as float32 (training checkpoints), float16, or compressed for shipping: int8 (one float16 scale a
row) or int4 (two codes a byte, one float16 scale each GROUP inputs of a row), symmetric round-to-nearest, each 2-D
weight `name` as `name` (codes) + `name.scale`; vectors (biases, norms) stay float16. The head only proposes tokens
the target verifies, so its bits change how many drafts are accepted, never the output. load_head widens any of them
to float32."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Union

import numpy as np

from ..tensor_functions import from_numpy
from .draft_head import HEAD_FORMAT, DraftHead, DraftHeadConfig, target_fingerprint
from .errors import ModelLoadError

WEIGHTS_FILE = "head.safetensors"
CONFIG_FILE = "head.json"
DTYPES = ("float32", "float16", "int8", "int4")  # save_head's storage choices
GROUP = 32  # int4: inputs sharing one scale


def quantize(w: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(codes, float16 scales) of a 2-D float weight: int8, one scale a row (codes in -127..127); int4, one scale each
    GROUP columns (codes in -7..7, two a byte: low nibble = even column). Scale = the largest |w| it covers / the
    largest code; round to nearest."""
    w = np.asarray(w, dtype=np.float32)
    rows, cols = w.shape
    if dtype == "int8":
        scale = (np.abs(w).max(axis=1, keepdims=True) / 127.0).astype(np.float16)
        s = scale.astype(np.float32)
        codes = np.clip(np.rint(np.divide(w, s, out=np.zeros_like(w), where=s > 0)), -127, 127).astype(np.int8)
        return codes, scale
    if dtype != "int4":
        raise ValueError(f"quantize takes int8 or int4, got {dtype!r}")
    if cols % GROUP:
        raise ValueError(f"int4 needs columns in groups of {GROUP}, got {cols}")
    g = w.reshape(rows, cols // GROUP, GROUP)
    scale = (np.abs(g).max(axis=2) / 7.0).astype(np.float16)
    s = scale.astype(np.float32)[:, :, None]
    q = np.clip(np.rint(np.divide(g, s, out=np.zeros_like(g), where=s > 0)), -7, 7).astype(np.int8).reshape(rows, cols)
    u = (q & 0xF).astype(np.uint8)  # two's complement nibbles
    return (u[:, 0::2] | (u[:, 1::2] << 4)).astype(np.uint8), scale


def dequantize(codes: np.ndarray, scale: np.ndarray, dtype: str) -> np.ndarray:
    """The float32 weight that quantize's codes and scales stand for."""
    s = np.asarray(scale, dtype=np.float32)
    if dtype == "int8":
        return codes.astype(np.float32) * s
    lo, hi = (codes & 0xF).astype(np.int8), (codes >> 4).astype(np.int8)
    q = np.empty((codes.shape[0], codes.shape[1] * 2), np.int8)
    q[:, 0::2], q[:, 1::2] = np.where(lo > 7, lo - 16, lo), np.where(hi > 7, hi - 16, hi)
    rows, cols = q.shape
    return (q.reshape(rows, cols // GROUP, GROUP).astype(np.float32) * s[:, :, None]).reshape(rows, cols)


def save_head(head: DraftHead, folder: Union[str, Path], dtype: str = "float32") -> Path:
    """head.safetensors (float32; float16: half the file, for drafting; int8 / int4: a quarter / an eighth, for
    shipping; training checkpoints keep float32) + head.json in `folder`, each written whole or not at all."""
    arrays = {name: p.value.to_numpy() for name, p in head.named_parameters()}
    return write_head(arrays, head.config.to_dict(), folder, dtype)


def compress_head(src: Union[str, Path], folder: Union[str, Path], dtype: str = "int4") -> Path:
    """A saved float head (src: its folder) written again into `folder` with its weights stored as `dtype`; head.json
    (the target's fingerprint, the training record) as it was. No target needed."""
    src = Path(src)
    stored = _stored_dtype(src / WEIGHTS_FILE)
    if stored not in ("float32", "float16"):
        raise ModelLoadError(f"{src / WEIGHTS_FILE} is stored as {stored}: compress the float head it came from")
    config = json.loads((src / CONFIG_FILE).read_text())
    return write_head(_load_stored(src / WEIGHTS_FILE), config, folder, dtype)


def write_head(arrays: dict[str, np.ndarray], config: dict[str, Any], folder: Union[str, Path], dtype: str) -> Path:
    """The two files of a head from its float weights (name -> array) and head.json's fields."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    out: dict[str, np.ndarray] = {}
    for name, w in arrays.items():
        w = np.asarray(w, dtype=np.float32)
        if dtype in ("int8", "int4") and w.ndim == 2:
            out[name], out[name + ".scale"] = quantize(w, dtype)
        else:
            out[name] = np.ascontiguousarray(w, dtype="float32" if dtype == "float32" else "float16")
    tmp = folder / (WEIGHTS_FILE + ".tmp")
    save_file(out, str(tmp), metadata={"format": HEAD_FORMAT, "weights": dtype})
    tmp.replace(folder / WEIGHTS_FILE)
    tmpc = folder / (CONFIG_FILE + ".tmp")
    tmpc.write_text(json.dumps(config, indent=1) + "\n")
    tmpc.replace(folder / CONFIG_FILE)
    return folder


def load_head(folder: Union[str, Path], target: Any, backend: Any = None) -> DraftHead:
    """A saved head for `target`; a missing, corrupt or other target's head is a ModelLoadError naming it."""
    from .safetensors_io import read_safetensors

    folder = Path(folder)
    if folder.is_file() and folder.name in (WEIGHTS_FILE, CONFIG_FILE):
        folder = folder.parent
    cfg_path, w_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    if not cfg_path.is_file() or not w_path.is_file():
        raise ModelLoadError(f"no draft head in {folder} (needs {CONFIG_FILE} and {WEIGHTS_FILE}); "
                             "train one with project/train_draft_head.py")
    try:
        cfg = DraftHeadConfig.from_dict(json.loads(cfg_path.read_text()))
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"malformed JSON in {cfg_path}: {e}") from None
    fp = target_fingerprint(target)
    if cfg.target_fingerprint != fp:
        raise ModelLoadError(f"the draft head in {folder} was trained for another target (fingerprint "
                             f"{cfg.target_fingerprint}{' = ' + cfg.target_name if cfg.target_name else ''}), "
                             f"not this one ({fp}); train one for it with project/train_draft_head.py")
    backend = backend or target.backend
    head = DraftHead(cfg, backend)
    arrays = read_safetensors(w_path)
    stored = _stored_dtype(w_path)
    if stored not in DTYPES:
        raise ModelLoadError(f"draft head {w_path}: weights stored as {stored!r}, which this version cannot read")
    # codes stay integers only as stored (read_safetensors widens every tensor to float32)
    raw = _load_stored(w_path) if stored in ("int8", "int4") else {}
    for name, p in head.named_parameters():
        arr = arrays.get(name)
        if name + ".scale" in raw:
            arr = dequantize(raw[name], raw[name + ".scale"], stored)
        if arr is None or tuple(arr.shape) != tuple(p.value.shape):
            got = None if arr is None else tuple(arr.shape)
            raise ModelLoadError(f"draft head {w_path}: weight {name} is {got}, expected {tuple(p.value.shape)}")
        p.update(from_numpy(np.array(arr, dtype=np.float32), backend=backend))  # a copy: writable (fine-tuning)
        p.value.requires_grad_(False)
    return head


def _stored_dtype(path: Path) -> str:
    """The weights' storage (head.safetensors' metadata "weights"; files before it: float32 or float16)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="np") as f:
        return (f.metadata() or {}).get("weights", "float32")


def _load_stored(path: Path) -> dict[str, np.ndarray]:
    """Every tensor as stored (int8 / uint8 codes, float16 scales)."""
    from safetensors.numpy import load_file

    return load_file(str(path))
