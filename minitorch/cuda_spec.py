"""Greedy autoregressive and greedy speculative decoding over two `CudaDecoder`s (GPU fast path).

Greedy rule (Leviathan et al. 2023 at temperature 0): the draft proposes gamma tokens; the target
scores [last, d1..d_gamma] in one graph-captured verify step; d_i is accepted while it equals the
target's argmax at the previous position; the first mismatch is replaced by the target's token, and a
fully accepted run earns the bonus token. Caches roll back by moving the device position (stale
entries past it are overwritten by later steps). The output equals greedy target decoding.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Tuple

from .cuda_decode import CudaDecoder


def greedy_generate(model: CudaDecoder, prompt: List[int], n_new: int) -> List[int]:
    """n_new greedy tokens (the first from the prompt step, then graph-replayed decode steps)."""
    first = model.prefill(prompt)
    return [first] + (model.decode(n_new - 1) if n_new > 1 else [])


def greedy_speculative(target: CudaDecoder, draft: CudaDecoder, prompt: List[int], n_new: int,
                       gamma: int = 4) -> Tuple[List[int], Dict[str, Any]]:
    """Greedy speculative decoding; returns (tokens, stats with drafted/accepted/alpha/tau/time)."""
    if gamma < 1 or gamma + 1 > target.max_tokens:
        raise ValueError(f"gamma must be in 1..{target.max_tokens - 1}, got {gamma}")
    if len(prompt) + n_new + gamma + 1 > min(target.max_len, draft.max_len):
        raise ValueError("prompt + new tokens + gamma exceed a decoder's max_len")
    t0 = time.perf_counter()
    out = [target.prefill(prompt)]
    draft.prefill(prompt)
    drafted = accepted = forwards = 0
    p0 = len(prompt)  # position of out[-1], not yet in either cache
    while len(out) < n_new:
        # draft gamma tokens: feed out[-1] (host -> device once), then replay the T=1 graph
        draft.run([out[-1]], all_logits=False, advance=True, graph=True)
        for _ in range(gamma - 1):
            draft.replay(1, all_logits=False, advance=True)
        draft.stream.synchronize()
        d = [int(x) for x in draft.history[p0 + 1:p0 + 1 + gamma].get()]
        ids = target.run([out[-1]] + d, all_logits=True, advance=False, graph=True)
        target.stream.synchronize()
        a = [int(x) for x in ids.get()]
        forwards += 1
        n = 0
        while n < gamma and d[n] == a[n]:
            n += 1
        drafted += gamma
        accepted += n
        out.extend(d[:n] + [a[n]])
        target.set_position(p0 + n + 1)
        if n == gamma:  # the draft never saw d_gamma: run it so its cache covers p0 + gamma
            draft.set_position(p0 + gamma)
            draft.run([d[-1]], all_logits=False, advance=True, graph=True)
        else:
            draft.set_position(p0 + n + 1)
        p0 += n + 1
    target.stream.synchronize()
    dt = time.perf_counter() - t0
    out = out[:n_new]
    stats = dict(drafted=drafted, accepted=accepted, alpha=accepted / max(drafted, 1),
                 tau=len(out) / max(forwards, 1), target_forwards=forwards, time_s=dt,
                 tokens_per_s=len(out) / dt)
    return out, stats
