"""Drafters: whatever proposes the next few tokens for the target to verify.

One small interface (`Drafter`):
- `start(prompt_ids, max_len, vocab_size)`: a new generation begins; drafts are drawn from the first
  vocab_size tokens (the vocabulary shared with the target). A model drafter prefills its own cache.
- `propose(tokens, gamma, cfg, rng) -> (draft_tokens, q)`: up to gamma tokens continuing `tokens`
  (prompt + output so far). q is a (n, V) float64 array with the draft distribution each token was
  sampled from, or None when the draft is deterministic (q is then the point mass on each token).
- `rollback(n_tokens)`: only the first n_tokens of the context are still valid (KV-cache rollback).
- `forwards`: number of model forwards run so far (0 for drafters without a model).

`ModelDrafter` runs a small draft model with its own KV cache; `NGramDrafter` is prompt lookup
(an n-gram match against prompt + output, as transformers' `prompt_lookup_num_tokens`);
`ExtendedDrafter` continues one drafter's proposals with another's (a model's, then free n-gram tokens).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from .sampling import SamplingConfig, logits_rows, logits_to_probs, sample

LOOKUP_MAX_NGRAM = 3  # prompt lookup's longest n-gram: NGramDrafter's, --draft-lookup's and kernels/lookup.cu's


class Drafter(Protocol):
    """The interface speculative_generate drives (see the module docstring)."""

    vocab_size: int | None
    forwards: int

    def start(self, prompt_ids: Sequence[int], max_len: int, vocab_size: int) -> None: ...

    def propose(self, tokens: Sequence[int], gamma: int, cfg: SamplingConfig,
                rng: np.random.Generator) -> tuple[list[int], np.ndarray | None]: ...

    def rollback(self, n_tokens: int) -> None: ...


class ModelDrafter:
    """A draft model decoding autoregressively with its own KV cache.

    Cache invariant: the cache holds K/V for `self._ids` (a prefix of the context); `propose` feeds
    the context tokens past it, then one token per further draft step.
    """

    def __init__(self, model: Any, vocab_size: int | None = None, head_vocab: int | None = None) -> None:
        """head_vocab: draft only among token ids below it (the draft model computes just those rows of
        its vocabulary projection). Byte-level BPE vocabularies are numbered in merge order, roughly
        by frequency, so the first ids are the common tokens: for Qwen2 the first 32,768 of 151,936
        rows cut a 0.5B draft's per-token reads by a fifth. Lossless: q is the distribution actually
        sampled from (zero above head_vocab), the target still emits any token (FR-Spec, Zhao et al. 2025,
        ranks by corpus frequency instead)."""
        self.model = model
        self.vocab_size = int(vocab_size or model.config.vocab_size)
        if head_vocab is not None and head_vocab < 1:
            raise ValueError(f"head_vocab must be >= 1, got {head_vocab}")
        self.head_vocab = head_vocab
        self._vocab = self.vocab_size  # the shared vocabulary of the current generation
        self.forwards = 0
        self.cache: Any = None
        self._ids: list[int] = []

    def start(self, prompt_ids: Sequence[int], max_len: int, vocab_size: int | None = None) -> None:
        """New cache sized for the whole generation; prefill all prompt tokens but the last."""
        self._vocab = min(self.vocab_size, int(vocab_size or self.vocab_size))
        self.cache = self.model.new_cache(max_len)
        self._ids = []
        self.forwards = 0
        if len(prompt_ids) > 1:
            self.model([int(t) for t in prompt_ids[:-1]], self.cache, last_n=1)  # only fills the cache
            self._ids = [int(t) for t in prompt_ids[:-1]]

    def rollback(self, n_tokens: int) -> None:
        """Keep only the first n_tokens positions (never grows the cache)."""
        if n_tokens < len(self._ids):
            self.cache.truncate(n_tokens)
            del self._ids[n_tokens:]

    def _sync(self, tokens: Sequence[int]) -> list[int]:
        """Roll back to the longest cached prefix of `tokens` (keeping at least one token to feed);
        return the tokens still to feed."""
        n = min(len(self._ids), len(tokens) - 1)
        if self._ids[:n] != list(tokens[:n]):
            n = next(i for i, (a, b) in enumerate(zip(self._ids, tokens)) if a != b)
        self.rollback(n)
        return [int(t) for t in tokens[n:]]

    def propose(self, tokens: Sequence[int], gamma: int, cfg: SamplingConfig,
                rng: np.random.Generator) -> tuple[list[int], np.ndarray | None]:
        """Draft gamma tokens; q rows are the draft's processed distributions (None when greedy)."""
        feed = self._sync(tokens)
        drafts: list[int] = []
        qs: list[np.ndarray] = []
        n_head = self._vocab if self.head_vocab is None else min(self.head_vocab, self._vocab)
        head = {"head_rows": n_head} if n_head < self._vocab else {}  # models without the option get none
        for i in range(gamma):
            rows = logits_rows(self.model(feed, self.cache, **head), n_head)  # (T, n_head)
            self.forwards += 1
            self._ids.extend(feed)
            if cfg.greedy:
                tok = int(np.argmax(rows[-1]))
            else:
                q = logits_to_probs(rows[-1], cfg)
                tok = sample(q, rng)
                if n_head < self._vocab:  # the distribution over the whole shared vocabulary
                    q = np.concatenate([q, np.zeros(self._vocab - n_head, dtype=q.dtype)])
                qs.append(q)
            drafts.append(tok)
            feed = [tok]
        return drafts, (np.stack(qs) if qs else None)


class NGramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the context's last n tokens (n from
    max_ngram down to min_ngram) and propose the tokens that followed it. No model, no cache.

    transformers' prompt lookup takes the first match; this takes the most recent one, which tends
    to continue the current line of reasoning. Drafts are deterministic (q = point mass).
    """

    def __init__(self, max_ngram: int = LOOKUP_MAX_NGRAM, min_ngram: int = 1) -> None:
        if not (1 <= min_ngram <= max_ngram):
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.vocab_size: int | None = None
        self.forwards = 0

    def start(self, prompt_ids: Sequence[int], max_len: int, vocab_size: int | None = None) -> None:
        self.forwards = 0

    def rollback(self, n_tokens: int) -> None:
        pass

    def propose(self, tokens: Sequence[int], gamma: int, cfg: SamplingConfig,
                rng: np.random.Generator) -> tuple[list[int], np.ndarray | None]:
        return lookup_match(tokens, gamma, self.max_ngram, self.min_ngram)[0], None


def lookup_match(tokens: Sequence[int], gamma: int, max_ngram: int = LOOKUP_MAX_NGRAM,
                 min_ngram: int = 1) -> tuple[list[int], int]:
    """Prompt lookup's rule (NGramDrafter): for n = max_ngram down to min_ngram, the latest earlier occurrence of the
    context's last n tokens; the first n that has one gives (up to gamma tokens that followed it, n). ([], 0) when
    none has one."""
    ctx = np.asarray(tokens, dtype=np.int64)
    n_ctx = ctx.shape[0]
    for n in range(min(max_ngram, n_ctx - 1), min_ngram - 1, -1):
        tail = ctx[n_ctx - n:]
        # windows starting at s = 0 .. n_ctx - n - 1 (the tail itself excluded)
        hit = np.ones(n_ctx - n, dtype=bool)
        for j in range(n):
            hit &= ctx[j:n_ctx - n + j] == tail[j]
        starts = np.flatnonzero(hit)
        if starts.size:
            s = int(starts[-1]) + n
            return [int(t) for t in ctx[s:s + gamma]], n
    return [], 0


def point_mass_rows(tokens: Sequence[int], vocab: int) -> np.ndarray:
    """(n, vocab) float64 rows, row i the point mass on tokens[i]: the q of a deterministic draft."""
    q = np.zeros((len(tokens), vocab), dtype=np.float64)
    q[np.arange(len(tokens)), np.asarray(tokens, dtype=np.int64)] = 1.0
    return q


class ExtendedDrafter:
    """`first` proposes up to `steps` tokens, then `then` continues the context plus those drafts up to the
    round's gamma (default `then`: prompt lookup). With a model first, the n-gram tokens cost no draft
    forward, only verify rows; a round's drafts are judged in order, so they count only where all of the
    model's were accepted. The model drafter's cache catches up on accepted n-gram tokens at its next
    propose (ModelDrafter._sync). q: both drafters' rows, a deterministic drafter's as point masses; None
    when both are deterministic."""

    def __init__(self, first: Any, steps: int, then: Any = None) -> None:
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        self.first, self.steps = first, int(steps)
        self.then = then if then is not None else NGramDrafter()
        sizes = [d.vocab_size for d in (self.first, self.then) if d.vocab_size is not None]
        self.vocab_size: int | None = min(sizes) if sizes else None

    @property
    def forwards(self) -> int:
        return self.first.forwards + self.then.forwards

    def start(self, prompt_ids: Sequence[int], max_len: int, vocab_size: int | None = None) -> None:
        self.first.start(prompt_ids, max_len, vocab_size)
        self.then.start(prompt_ids, max_len, vocab_size)

    def rollback(self, n_tokens: int) -> None:
        self.first.rollback(n_tokens)
        self.then.rollback(n_tokens)

    def propose(self, tokens: Sequence[int], gamma: int, cfg: SamplingConfig,
                rng: np.random.Generator) -> tuple[list[int], np.ndarray | None]:
        drafts, q = self.first.propose(tokens, min(gamma, self.steps), cfg, rng)
        more, q2 = ([], None)
        if gamma > len(drafts) and len(drafts) == min(gamma, self.steps):
            more, q2 = self.then.propose([*tokens, *drafts], gamma - len(drafts), cfg, rng)
        if not more:
            return drafts, q
        if q is None and q2 is None:
            return [*drafts, *more], None
        V = (q if q is not None else q2).shape[1]
        q = q if q is not None else point_mass_rows(drafts, V)
        q2 = q2 if q2 is not None else point_mass_rows(more, V)
        return [*drafts, *more], np.concatenate([q, q2])

