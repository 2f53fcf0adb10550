"""HeadDrafter: drafting with a trained draft head (minitorch/models/draft_head.py) on the target's features.

The head at position t reads (f_t, x_{t+1}): the target's final hidden state there and the next token, and
predicts x_{t+2}. The engine hands the drafter the target's features as it computes them (`observe`: the
prompt's after prefill, then those of each round's emitted positions), so with a context x_0..x_{n-1} whose
last token is the pending one, the features f_0..f_{n-2} are known and

    prefill  the prompt's features arrive (the first observe after start): head positions 0..n-3 in one step,
             during the engine's prefill, as a draft model reads the prompt in its start, so a round's first
             step feeds only the positions since the last round

    feed   head positions k..n-2 (those not cached yet) in one step -> g_{n-2}, whose logits give d_1
    draft  d_i for i >= 2 from the head's own feature: position n-3+i reads (g_{n-4+i}, d_{i-1})
    trim   the head's cache back to n-1 positions: the drafted positions read guessed features

Cache invariant between rounds: the head's cache holds positions whose inputs were the target's own
features (0..k-1, k <= number of features), the feature buffer f_0..f_{m-1} for the context's first m
tokens; `rollback(m)` forgets what lies past them.

Prompt lookup where the head is unsure (`lookup` = M > 0, greedy rounds): where the context's last M or more
tokens (up to LOOKUP_MAX_NGRAM) occurred earlier, the round may draft what followed their latest occurrence
(drafters.py lookup_match) instead of the head's drafts. Summaries, answers from given passages and rewrites copy
long spans of their context, which the head predicts poorly (Spec-Bench on one H100: the head's tau 1.24 on
summarization, where prompt lookup's drafts on the same outputs give 3.3 tokens a round); on math the head is the
better drafter. So every round runs the head's first step (`feed`: its cache stays exact, with no catch-up later) and
takes the looked-up drafts only where more of them are expected to be accepted than of the head's: the looked-up
drafts' by the run's measured acceptance of looked-up drafts at each position (apart by the length of the n-gram
matched: a 3-gram's continuation is right far more often than a 2-gram's), the head's by its confidence in its first
draft (its top probability), taken for its later drafts too. With a gate each looked-up draft is priced like the
head's, p the product of the looked-up rates up to it. With `lookup_min_prompt` = P > 0 a generation whose prompt has
fewer than P tokens drafts by the head alone: there the matches come from the answer's own text (a word problem's
repeated numbers), and on the CPU a few failed looked-up rounds early close the budget for many rounds.

A prompt window (`prompt_window` = W > 0): the head reads only the prompt's last W positions, its cache's first row
being context position `_base` (and its positions counted from there: RoPE scores depend on relative positions only,
so it is exactly a head that sees the window). On the CPU the head's step over a prompt is ~3% of the target's
prefill; W = 128 cost summaries a quarter of their first-draft agreement, so it is off by default
(docs/results/cpu_zen3_prompt_window/).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import from_numpy, tensor as make_tensor
from ..models.tree_step import TreeStep
from .drafters import LOOKUP_MAX_NGRAM, lookup_match
from .sampling import SamplingConfig, logits_rows, logits_to_probs, sample
from .tree import DraftTree, Extend, grow_tree

LOOKUP_PRIOR = 2.0  # judgements' worth of the prior (the first position's) or the previous position's rate in a rate
# A first looked-up draft's acceptance by the length of the n-gram matched (1, 2, 3 or more): on the target's own
# answers to the first 400 requests of data/chat (training text, not an evaluation set; first 128 ids of each),
# 0.215 of 7,048 matches, 0.477 of 2,772 and 0.800 of 12,095 (`python tools/lookup_rates.py`)
FIRST_LOOKUP_RATE = {1: 0.2, 2: 0.5, 3: 0.8}


def top_logprobs(logits: np.ndarray, k: int) -> tuple[list[int], list[float]]:
    """The k most probable ids of a row of logits (ties: the lower id first) and their log probabilities."""
    z = np.asarray(logits, dtype=np.float64)
    lp = z - (z.max() + np.log(np.exp(z - z.max()).sum()))
    ids = np.argsort(-lp, kind="stable")[:k]
    return [int(i) for i in ids], [float(lp[i]) for i in ids]


def top_probability(logits: np.ndarray) -> float:
    """The largest softmax probability of a row of logits: 1 / sum(exp(z - max z))."""
    z = np.asarray(logits, dtype=np.float64)
    return float(1.0 / np.exp(z - z.max()).sum())


class HeadDrafter:
    """The Drafter protocol (drafters.py) plus `needs_hidden` / `observe(features)` for the engine, and `gated`: its
    propose takes a gate (budget.py) and asks it before each draft."""

    needs_hidden = True
    gated = True

    def __init__(self, head: Any, target: Any, lookup: int = 0, prompt_window: int = 0,
                 lookup_min_prompt: int = 0) -> None:
        """lookup: M > 0 drafts by prompt lookup first where an n-gram of M or more tokens matches (module
        docstring); 0: the head drafts every round. prompt_window: W > 0 reads only the prompt's last W positions
        (module docstring); 0: all of them. lookup_min_prompt: P > 0 looks up only in generations whose prompt has P
        tokens or more (module docstring); 0: in every one."""
        if isinstance(lookup, bool) or not isinstance(lookup, int) or not 0 <= lookup <= LOOKUP_MAX_NGRAM:
            raise ValueError(f"lookup must be an integer in 0..{LOOKUP_MAX_NGRAM}, got {lookup!r}")
        if isinstance(prompt_window, bool) or not isinstance(prompt_window, int) or prompt_window < 0:
            raise ValueError(f"prompt_window must be an integer >= 0, got {prompt_window!r}")
        if isinstance(lookup_min_prompt, bool) or not isinstance(lookup_min_prompt, int) or lookup_min_prompt < 0:
            raise ValueError(f"lookup_min_prompt must be an integer >= 0, got {lookup_min_prompt!r}")
        self.head, self.target, self.lookup, self.prompt_window = head, target, lookup, prompt_window
        self.lookup_min_prompt = lookup_min_prompt
        self._lookup_now = lookup  # this generation's: lookup, or 0 where its prompt is shorter than lookup_min_prompt
        self._base = 0  # the context position of the head cache's first row (> 0 where the prompt was windowed)
        self.lookup_rounds = 0  # this generation's rounds drafted by prompt lookup
        self._round: tuple[int, int, int] | None = None  # (match length, context length, drafts) of a looked-up round
        self._counts: dict[int, list[list[int]]] = {}  # match length -> by draft position: [accepted, judged]
        self.vocab_size: int | None = None  # proposes among head_vocab ids of the target's vocabulary
        self.forwards = 0
        self._vocab = int(target.config.vocab_size)
        self._lm = target.lm_head_weight()
        self._emb = target.model.embed_tokens
        self.cache: Any = None
        self._feats = np.zeros((0, head.config.hidden_size), dtype=np.float32)
        self._n_feats = 0
        self._prompt: list[int] | None = None  # set by start until the prompt's features are read

    def start(self, prompt_ids: Sequence[int], max_len: int, vocab_size: int | None = None) -> None:
        """New generation: an empty head cache and feature buffer (features arrive through observe)."""
        self._vocab = min(int(self.target.config.vocab_size), int(vocab_size or self._vocab))
        self.cache = self.head.new_cache(max_len)
        self._feats = np.zeros((max_len, self.head.config.hidden_size), dtype=np.float32)
        self._n_feats = 0
        self._base = 0
        self.forwards = 0
        self._prompt = [int(t) for t in prompt_ids]
        self._lookup_now = self.lookup if len(self._prompt) >= self.lookup_min_prompt else 0
        self.lookup_rounds, self._round, self._counts = 0, None, {}

    def observe(self, feats: Any) -> None:
        """Append the target's features (T, D) (or (1, T, D), a Tensor or array) of the next context positions; the
        prompt's (the first call after start) are read at once, all but the last position (the first round's)."""
        arr = np.asarray(feats.to_numpy() if hasattr(feats, "to_numpy") else feats, dtype=np.float32)
        arr = arr.reshape(-1, self._feats.shape[1])
        self._feats[self._n_feats:self._n_feats + arr.shape[0]] = arr
        self._n_feats += arr.shape[0]
        prompt, self._prompt = self._prompt, None
        if prompt is not None and self._n_feats >= 2 and self.cache.length == 0:
            n = self._n_feats  # head positions 0..n-2 read f_0..f_{n-2}; the last waits for the first round
            b = max(0, n - 1 - self.prompt_window) if self.prompt_window else 0  # the window's first position
            self._base = b
            feats = from_numpy(self._feats[b:n - 1][None], backend=self.head.backend)
            # their outputs are never read: only their K/V enter the cache
            self.head.draft_step(feats, self._embed(prompt[b + 1:n]), self.cache, self._lm, self._rows(), kv_only=True)
            self.forwards += 1

    def rollback(self, n_tokens: int) -> None:
        """Only the context's first n_tokens positions are still valid. After a looked-up round (the engine rolls back
        to the context less its pending token: n before the round + the drafts accepted) its drafts are counted by
        position, apart by the length of the match: judged up to the first rejected, accepted before it."""
        if self._round is not None:
            ngram, n0, g = self._round
            self._round = None
            counts = self._counts.setdefault(ngram, [])
            accepted = max(0, min(g, n_tokens - n0))
            for i in range(min(accepted + 1, g)):
                if i == len(counts):
                    counts.append([0, 0])
                counts[i][0] += i < accepted
                counts[i][1] += 1
        self._n_feats = min(self._n_feats, n_tokens)
        if self.cache is not None and self._base + self.cache.length > n_tokens:
            if n_tokens < self._base:  # back before the window's start: the head starts again there
                self._base = n_tokens
            self.cache.truncate(n_tokens - self._base)

    def _rows(self) -> int:
        """The LM-head rows the head proposes among: its head_vocab ids of the shared vocabulary."""
        return min(self.head.config.head_vocab, self._vocab)

    def _embed(self, ids: Sequence[int]) -> Any:
        return self._emb(make_tensor([list(ids)], dtype="int64", backend=self.head.backend))  # (1, T, D)

    def _step(self, feats: Any, ids: Sequence[int]) -> tuple[Any, np.ndarray]:
        """The head over new positions: (g (1, T, D), logits of the last position over the head's ids)."""
        n_head = self._rows()
        last, logits = self.head.draft_step(feats, self._embed(ids), self.cache, self._lm, n_head)  # (1, 1, D)
        self.forwards += 1
        return last, logits_rows(logits, n_head)[-1]

    def _check_features(self, n: int) -> None:
        if self._n_feats < n - 1:
            raise RuntimeError(f"the head has features for {self._n_feats} positions, needs {n - 1}: the engine "
                               "must pass the target's features to observe()")

    def _feed(self, tokens: Sequence[int]) -> tuple[Any, np.ndarray]:
        """The head over the context's positions it has not cached yet (`feed` in the module docstring): g of the
        last (1, 1, D) and its logits row, whose top token is the first draft."""
        n = len(tokens)
        self._check_features(n)
        if self._base + self.cache.length > n - 2:  # the same context again (no new token since the last call): its
            self.cache.truncate(max(0, n - 2 - self._base))  # last position
            self._base = min(self._base, n - 2)
        k = self._base + self.cache.length  # the first context position the head has not read
        feats = from_numpy(self._feats[k:n - 1][None], backend=self.head.backend)  # (1, n-1-k, D)
        return self._step(feats, [int(t) for t in tokens[k + 1:n]])

    def propose(self, tokens: Sequence[int], gamma: int, cfg: SamplingConfig, rng: np.random.Generator,
                gate: Any = None) -> tuple[list[int], np.ndarray | None]:
        """Up to gamma drafts; with a gate (budget.py's gated CostBudget) fewer: before draft i the gate is asked with
        p, the product of the head's top probabilities so far (its confidence, read before the draw: a kept draft is
        still a draw from q), whether to keep it (`include`) and whether to run the step for the next (`extend`)."""
        n = len(tokens)
        if n < 2:  # no feature yet (a one-token prompt): nothing to draft from
            self._check_features(n)
            return [], None
        g, row = self._feed(tokens)
        if self._lookup_now and cfg.greedy:
            looked_up = self._looked_up(tokens, gamma, gate, top_probability(row))
            if looked_up:  # the head's cache holds n - 1 positions after its feed: the verified prefix
                return looked_up, None
        drafts: list[int] = []
        qs: list[np.ndarray] = []
        n_head = row.shape[0]
        p = 1.0
        for i in range(gamma):
            if cfg.greedy:
                tok = int(np.argmax(row))
                if gate is not None:
                    p *= top_probability(row)
            else:
                q = logits_to_probs(row, cfg)
                p *= float(q.max())
            if gate is not None and not gate.include(i + 1, p):
                break
            if not cfg.greedy:
                tok = sample(q, rng)
                if n_head < self._vocab:  # the distribution over the whole shared vocabulary
                    q = np.concatenate([q, np.zeros(self._vocab - n_head, dtype=q.dtype)])
                qs.append(q)
            drafts.append(tok)
            if i + 1 < gamma:
                if gate is not None and not gate.extend(i + 1, p):
                    break
                g, row = self._step(g, [tok])
        self.cache.truncate(n - 1 - self._base)
        return drafts, (np.stack(qs) if qs else None)

    def lookup_rate(self, i: int, ngram: int = LOOKUP_MAX_NGRAM) -> float:
        """The measured acceptance of looked-up drafts at position i (0-based), given the earlier ones accepted, in
        rounds whose match was `ngram` tokens long (counted apart by length), shrunk towards position i - 1's with
        LOOKUP_PRIOR judgements' weight (position 0's towards FIRST_LOOKUP_RATE of that length)."""
        ngram = min(ngram, LOOKUP_MAX_NGRAM)
        prior = FIRST_LOOKUP_RATE[ngram] if i == 0 else self.lookup_rate(i - 1, ngram)
        counts = self._counts.get(ngram, [])
        accepted, judged = counts[i] if i < len(counts) else (0, 0)
        return (accepted + LOOKUP_PRIOR * prior) / (judged + LOOKUP_PRIOR)

    def _looked_up(self, tokens: Sequence[int], gamma: int, gate: Any, head_p: float) -> list[int]:
        """A round's drafts by prompt lookup (an n-gram of self.lookup tokens or more matched) where they are expected
        to have more accepted than the head's: the sum over positions of the product of lookup_rate up to each,
        against head_p + head_p^2 + ... + head_p^gamma (head_p: the head's top probability for its own first draft,
        taken for its later ones too). Each kept draft is asked of the gate with p the product of lookup_rate so far;
        [] where none matched, the head is expected to do better or none is kept."""
        found, ngram = lookup_match(tokens, gamma, LOOKUP_MAX_NGRAM, self.lookup)
        if not found:
            return []
        rates = [self.lookup_rate(i, ngram) for i in range(len(found))]
        expect_lookup, p = 0.0, 1.0
        for r in rates:
            p *= r
            expect_lookup += p
        expect_head = sum(head_p ** k for k in range(1, gamma + 1))
        if expect_lookup < expect_head:
            return []
        kept: list[int] = []
        p = 1.0
        for i, tok in enumerate(found):
            p *= rates[i]
            if gate is not None and not gate.include(i + 1, p):
                break
            kept.append(tok)
        if kept:
            self._round = (ngram, len(tokens), len(kept))
            self.lookup_rounds += 1
        return kept

    def propose_tree(self, tokens: Sequence[int], top_k: int, depth: int, budget: int,
                     extend: Extend | None = None) -> DraftTree:
        """A draft tree below the pending token (tree.py's grow_tree: EAGLE-2's selection by the head's log
        probabilities), each level one head step: the frontier's nodes fed at once as a TreeStep, each at its depth's
        position reading its parent's g and seeing its own ancestors' rows in the head's cache (not its siblings').
        The same tree as expanding each path alone (tests/test_tree_decoding.py); the cache is trimmed after. extend:
        grow_tree's (a level only below the nodes it accepts)."""
        n = len(tokens)
        if n < 2:
            raise RuntimeError("a draft tree needs a context of two tokens or more")
        g, row = self._feed(tokens)
        base = self.cache.length  # n - 1 - self._base: the tree's rows go after
        fed: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray, np.ndarray]] = {
            (): (g.to_numpy().reshape(-1), row, np.zeros(0, dtype=np.uint8))}  # path -> (g, logits, sees)
        n_head = row.shape[0]

        def expand(paths: Sequence[Sequence[int]], k_top: int) -> list[tuple[list[int], list[float]]]:
            new = [tuple(int(t) for t in p) for p in paths if tuple(p) not in fed]
            if new:
                t_len, start = len(new), self.cache.length
                width = start - base + t_len
                mask = np.zeros((t_len, width), dtype=np.uint8)
                positions = np.empty(t_len, dtype=np.int64)
                for r, p in enumerate(new):
                    sees = fed[p[:-1]][2]
                    mask[r, :sees.shape[0]] = sees
                    mask[r, start - base + r] = 1
                    positions[r] = n - 2 - self._base + len(p)  # the head's positions count from its cache's first row
                parent_g = np.stack([fed[p[:-1]][0] for p in new])[None]
                gs, logits = self.head.draft_step(from_numpy(parent_g, backend=self.head.backend),
                                                  self._embed([p[-1] for p in new]), self.cache, self._lm, n_head,
                                                  tree=TreeStep(positions, mask, base))
                self.forwards += 1
                gs, logits = gs.to_numpy()[0], logits_rows(logits, n_head)
                for r, p in enumerate(new):
                    fed[p] = (gs[r], logits[r], mask[r])
            return [top_logprobs(fed[tuple(int(t) for t in p)][1], k_top) for p in paths]

        tree = grow_tree(expand, top_k, depth, budget, extend)
        self.cache.truncate(n - 1 - self._base)
        return tree
