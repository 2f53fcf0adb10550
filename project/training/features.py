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
from typing import Any, Callable, Sequence

import numpy as np

from minitorch import no_grad
from minitorch.models.safetensors_io import bf16_to_float32

from .data import Sequence_


WINDOW = 256  # sequences whose forwards are grouped by length (FeatureStore.extract)


def length_groups(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """The indices of `lengths` in groups that share a forward, shortest first: each group grows while its size
    times its longest stays within batch_tokens (0: one index a group, in order)."""
    if batch_tokens <= 0:
        return [[i] for i in range(len(lengths))]
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda j: lengths[j]):  # stable: ties keep their order
        if groups and lengths[i] * (len(groups[-1]) + 1) <= batch_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


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

    def extract(self, target: Any, progress: bool = True, time_limit: float | None = None, batch_tokens: int = 0,
                rows_of: Callable[[Sequence[int]], np.ndarray] | None = None, window: int = WINDOW) -> None:
        """Run the target over every sequence not done yet (no cache); with a time_limit (seconds) stop when it is
        spent (the done ones stay usable, a later call continues). batch_tokens > 0: the next `window` sequences are
        taken together, shortest first, and share forwards, right-padded, while batch x longest <= batch_tokens (a
        causal position never reads a padded one after it): on the GPU one sequence a forward leaves it waiting on
        the host's launches, and in their own order mixed lengths pad to about twice the tokens (random weights of
        the 1.5B on one H100: 2.07x padded, 17.9k tokens/s; by length within windows of 256: 1.10x, 36.3k, and
        28.0k with this store's copies; docs/results/h100_features/). A window is done, and saved, as a whole.
        0 = one sequence a forward (the CPU's fused forward takes one). rows_of(ids) -> (T, D): another way to the
        features of one sequence, one sequence at a time (DecoderRows: the CUDA decoder's bf16 prefill)."""
        import time

        from tqdm import tqdm

        from minitorch import tensor as make_tensor

        t0 = time.perf_counter()
        bar = tqdm(total=len(self.seqs) - self.done, desc="target features", unit="seq",
                   disable=not progress or self.done == len(self.seqs))
        batched = batch_tokens > 0 and rows_of is None
        with no_grad():
            while self.done < len(self.seqs):
                end = min(len(self.seqs), self.done + (window if batched else 1))
                for group in length_groups([len(self.seqs[i].ids) for i in range(self.done, end)],
                                           batch_tokens if batched else 0):
                    group = [self.done + g for g in group]
                    if rows_of is not None:
                        i = group[0]
                        self.data[self.offsets[i]:self.offsets[i + 1]] = rows_of(self.seqs[i].ids)
                        continue
                    longest = max(len(self.seqs[i].ids) for i in group)
                    ids = np.zeros((len(group), longest), np.int64)  # padding: token 0, never read by a real position
                    for b, i in enumerate(group):
                        ids[b, :len(self.seqs[i].ids)] = self.seqs[i].ids
                    _, hidden = target(make_tensor(ids.tolist(), dtype="int64", backend=target.backend), None,
                                       last_n=1, return_hidden=True)  # (B, T, D)
                    h = np.asarray(hidden.to_numpy(), np.float32)
                    for b, i in enumerate(group):
                        self.data[self.offsets[i]:self.offsets[i + 1]] = h[b, :len(self.seqs[i].ids)]
                before, self.done = self.done, end
                bar.update(end - before)
                if batched or self.done % 64 == 0 or self.done == len(self.seqs):  # one at a time: saved every 64
                    self.data.flush()
                    self._save_meta()
                if time_limit is not None and time.perf_counter() - t0 > time_limit:
                    break
        bar.close()
        self.data.flush()
        self._save_meta()

    def rows(self, i: int) -> np.ndarray:
        """(T_i, D) float16 features of sequence i."""
        if i >= self.done:
            raise RuntimeError(f"features of sequence {i} not extracted yet")
        return self.data[self.offsets[i]:self.offsets[i + 1]]


class DecoderRows:
    """The features of one sequence by the CUDA decoder (minitorch/cuda/decoder.py): its prefill of the sequence in
    captured chunks of max_tokens rows (CudaDecoder.fill_cache), each chunk's final normed hidden states (xn, bf16)
    copied on the device as the chunk is enqueued, read back once a sequence. What a draft head reads when it
    drafts on the GPU, computed by the kernels that compute it there (bf16 weights and activations); not faster than
    the float32 model's batched forward (one H100: 30.9k tokens/s against 40.3k, docs/results/h100_features/).
    `decoder`: a CudaDecoder whose max_len holds the longest sequence and its last chunk's padding."""

    def __init__(self, decoder: Any) -> None:
        self.dec = decoder
        self.buf = decoder.cp.zeros((decoder.max_len, decoder.H), decoder.cp.uint16)

    def __call__(self, ids: Sequence[int]) -> np.ndarray:
        dec, n = self.dec, len(ids)
        if n > dec.max_len:
            raise ValueError(f"a sequence of {n} tokens does not fit the decoder's {dec.max_len} positions")

        def grab(s: int, m: int) -> None:  # xn[0:m] holds positions s..s+m-1 until the next chunk overwrites it
            with dec.stream:
                self.buf[s:s + m] = dec.xn[:m]

        dec.fill_cache([int(t) for t in ids], after_chunk=grab)  # synchronises its stream at the end
        return bf16_to_float32(self.buf[:n].get())
