"""A draft head's files: head.safetensors (its weights) + head.json (DraftHeadConfig, with the fingerprint of the
target it was trained for). `save_head` writes both, each whole or not at all; `load_head` refuses a missing,
corrupt or other target's head with a ModelLoadError that names it."""
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


def save_head(head: DraftHead, folder: Union[str, Path], dtype: str = "float32") -> Path:
    """head.safetensors (float32, or float16: half the file, for drafting; training checkpoints keep float32)
    + head.json in `folder`, each written whole or not at all."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if dtype not in ("float32", "float16"):
        raise ValueError(f"dtype must be float32 or float16, got {dtype!r}")
    arrays = {name: np.ascontiguousarray(p.value.to_numpy(), dtype=dtype) for name, p in head.named_parameters()}
    tmp = folder / (WEIGHTS_FILE + ".tmp")
    save_file(arrays, str(tmp), metadata={"format": HEAD_FORMAT})
    tmp.replace(folder / WEIGHTS_FILE)
    tmpc = folder / (CONFIG_FILE + ".tmp")
    tmpc.write_text(json.dumps(head.config.to_dict(), indent=1) + "\n")
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
    for name, p in head.named_parameters():
        arr = arrays.get(name)
        if arr is None or tuple(arr.shape) != tuple(p.value.shape):
            got = None if arr is None else tuple(arr.shape)
            raise ModelLoadError(f"draft head {w_path}: weight {name} is {got}, expected {tuple(p.value.shape)}")
        p.update(from_numpy(np.array(arr, dtype=np.float32), backend=backend))  # a copy: writable (fine-tuning)
        p.value.requires_grad_(False)
    return head
