"""The target's final hidden states over the training sequences, computed once by our own model and kept on disk.

features.npy is a float16 memory map of every sequence's features end to end (rows = tokens), features.json
the sequences' token ids, prompt lengths and how many are done; an interrupted extraction resumes at the first
unfinished sequence. The file is keyed by the target's fingerprint and the token ids, so a changed dataset or
target starts afresh instead of training on stale features.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from minitorch import no_grad

from .data import Sequence_


class FeatureStore:
    """Features (float16) of a list of sequences, computed by `extract` and read by `rows(i)`."""

    def __init__(self, folder: Path, seqs: Sequence[Sequence_], dims: int, fingerprint: str) -> None:
        self.folder, self.seqs, self.dims = Path(folder), list(seqs), int(dims)
        self.offsets = np.cumsum([0] + [len(s.ids) for s in self.seqs])
        key = hashlib.sha256(fingerprint.encode())
        for s in self.seqs:
            key.update(np.asarray(s.ids, dtype=np.int32).tobytes() + b"|")
        self.key = key.hexdigest()[:16]
        self.folder.mkdir(parents=True, exist_ok=True)
        self.meta_path, self.data_path = self.folder / "features.json", self.folder / "features.npy"
        meta = json.loads(self.meta_path.read_text()) if self.meta_path.is_file() else {}
        if meta.get("key") != self.key or not self.data_path.is_file():
            meta = {"key": self.key, "done": 0, "rows": int(self.offsets[-1]), "dims": self.dims}
            np.lib.format.open_memmap(self.data_path, mode="w+", dtype=np.float16, shape=(int(self.offsets[-1]), self.dims))
            self.meta_path.write_text(json.dumps(meta))
        self.done = int(meta["done"])
        self.data = np.load(self.data_path, mmap_mode="r+")

    def _save_meta(self) -> None:
        tmp = self.meta_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"key": self.key, "done": self.done, "rows": int(self.offsets[-1]), "dims": self.dims}))
        tmp.replace(self.meta_path)

    def extract(self, target: Any, progress: bool = True, every: int = 64, time_limit: float | None = None) -> None:
        """Run the target over every sequence not done yet (one forward each, no cache), in order; with a
        time_limit (seconds) stop when it is spent (the done ones stay usable, a later call continues)."""
        import time

        from tqdm import tqdm

        t0 = time.perf_counter()
        todo = range(self.done, len(self.seqs))
        bar = tqdm(todo, desc="target features", unit="seq", disable=not progress or not len(todo), initial=0)
        with no_grad():
            for i in bar:
                ids = self.seqs[i].ids
                _, hidden = target(ids, None, last_n=1, return_hidden=True)  # (1, T, D)
                self.data[self.offsets[i]:self.offsets[i + 1]] = np.asarray(hidden.to_numpy(), np.float32)[0]
                self.done = i + 1
                if self.done % every == 0 or self.done == len(self.seqs):
                    self.data.flush()
                    self._save_meta()
                if time_limit is not None and time.perf_counter() - t0 > time_limit:
                    break
        self.data.flush()
        self._save_meta()

    def rows(self, i: int) -> np.ndarray:
        """(T_i, D) float16 features of sequence i."""
        if i >= self.done:
            raise RuntimeError(f"features of sequence {i} not extracted yet")
        return self.data[self.offsets[i]:self.offsets[i + 1]]
