"""Autoregressive decoding with the KV cache: the baseline, and the loop a draft model runs.

gpt-fast layout: `prefill` feeds the prompt, `decode_one_token` feeds one token and picks the next.
A model is anything with `new_cache(max_len)`, `__call__(ids, cache) -> (1, T, V) logits` and
`config.vocab_size` (the model protocol, docs/ARCHITECTURE.md). Cache invariant after `generate`: the cache holds every
token of prompt + output except the last one (its logits were never needed).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .. import no_grad
from .sampling import SamplingConfig, logits_rows, next_token
from .stats import GenerationResult, Timer

TokenCallback = Callable[[list[int]], None]


def context_limit(model: Any) -> int | None:
    """The model's maximum number of positions (config.max_position_embeddings), or None if unknown."""
    n = getattr(model.config, "max_position_embeddings", None)
    return int(n) if n else None


def check_request(model: Any, prompt_ids: Sequence[int], max_new_tokens: int) -> None:
    """Refuse bad requests with one clear ValueError (empty prompt, bad limit, prompt too long)."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if len(prompt_ids) == 0:
        raise ValueError("the prompt is empty: give at least one token")
    limit = context_limit(model)
    if limit is not None and len(prompt_ids) + max_new_tokens > limit:
        raise ValueError(
            f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
            f"model's context of {limit} positions: shorten the prompt or lower --max-new-tokens"
        )


def emit(candidates: Sequence[int], out: list[int], max_new_tokens: int,
         stop_ids: set[int]) -> tuple[int, bool]:
    """Append candidates to out up to the token limit and up to (including) the first stop token.

    Returns (number appended, finished).
    """
    n = 0
    for tok in candidates:
        if len(out) >= max_new_tokens:
            return n, True
        out.append(int(tok))
        n += 1
        if tok in stop_ids:
            return n, True
    return n, len(out) >= max_new_tokens


def prefill(model: Any, cache: Any, ids: Sequence[int]) -> Any:
    """Feed a run of tokens; returns the (1, 1, V) logits of the last one (the vocabulary projection
    of the other positions would be thrown away, so the model skips it)."""
    return model(list(ids), cache, last_n=1)


def decode_one_token(model: Any, cache: Any, token: int, cfg: SamplingConfig, rng: Any,
                     vocab_size: int) -> int:
    """Feed one token and pick the next one from its logits."""
    row = logits_rows(model([int(token)], cache), vocab_size)[-1]
    return next_token(row, cfg, rng)


@no_grad()  # inference: no autodiff history
def generate(model: Any, prompt_ids: Sequence[int], max_new_tokens: int,
             cfg: SamplingConfig | None = None, stop_ids: Iterable[int] | None = None,
             vocab_size: int | None = None, on_tokens: TokenCallback | None = None,
             cache: Any = None) -> GenerationResult:
    """Plain autoregressive generation: one target forward per new token.

    vocab_size limits the candidate tokens to the first vocab_size logits (default: the model's
    config.vocab_size); speculative decoding uses the shared draft/target vocabulary the same way.
    on_tokens is called with each batch of newly emitted tokens (streaming).
    """
    cfg = cfg or SamplingConfig()
    prompt = [int(t) for t in prompt_ids]
    check_request(model, prompt, max_new_tokens)
    stops = set(int(s) for s in (stop_ids or ()))
    vocab = int(vocab_size or model.config.vocab_size)
    rng = cfg.make_rng()
    timer = Timer()
    t0 = time.perf_counter()
    if cache is None:
        cache = model.new_cache(len(prompt) + max_new_tokens)
    out: list[int] = []
    with timer("prefill"):
        row = logits_rows(prefill(model, cache, prompt), vocab)[-1]
    with timer("sample"):
        tok = next_token(row, cfg, rng)
    forwards = 0
    while True:
        _, done = emit([tok], out, max_new_tokens, stops)
        if on_tokens is not None:
            on_tokens([tok])
        if done:
            break
        with timer("verify"):
            row = logits_rows(model([tok], cache), vocab)[-1]
        forwards += 1
        with timer("sample"):
            tok = next_token(row, cfg, rng)
    return autoregressive_result(out, stops, forwards, timer, time.perf_counter() - t0)


def autoregressive_result(out: list[int], stops: set[int], forwards: int, timer: Timer,
                          total: float) -> GenerationResult:
    """Tokens, stop reason and statistics of a generation that made one token per target forward
    (timer phases: prefill, verify = the one-token forwards, sample)."""
    stats = {
        "new_tokens": len(out),
        "target_forwards": forwards,
        "tau": 1.0,
        "time_prefill": timer.get("prefill"),
        "time_verify": timer.get("verify"),
        "time_sample": timer.get("sample"),
        "time_total": total,
        "tokens_per_s": len(out) / total if total > 0 else 0.0,
        "decode_tokens_per_s": forwards / timer.get("verify") if timer.get("verify") > 0 else 0.0,
    }
    return GenerationResult(tokens=out, stop_reason="stop" if out and out[-1] in stops else "length", stats=stats)
