"""Model / drafter / sampling flags of the benchmarks, and the generators they run.

Flags and settings are settings.py's, loading cli_common's, generation minitorch's engine. `load_engine(args,
modes)` loads the models and returns one generator per mode: "spec" (the engine), "target" (the target alone,
same sampling and vocabulary), and with --compare-hf the transformers baselines "hf_greedy" / "hf_assisted"
(hf.py). Each generator takes (prompt_ids, max_new_tokens, seed), so a problem samples the same way whichever
shard runs it. With --batch N > 1 the engine is the target alone and `Engine.batch` runs many generations at once
(batch.py's BatchFn over minitorch's Engine.generate_batch).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from .data import Tokenizer
from .batch import BatchFn, batch_generator
from .runner import GenerateFn, RoundLog, round_log_stats


@dataclass
class Engine:
    """Generators per mode, the tokenizer that builds prompts, and the settings stored with results."""

    tokenizer: Tokenizer
    modes: dict[str, GenerateFn]
    config: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)
    batch: Optional[BatchFn] = None  # --batch N > 1: the target alone, N generations at once (batch.py)


def add_engine_args(p: argparse.ArgumentParser, default_max_new_tokens: int) -> None:
    """The flags of run_spec_decoding.py (settings.py): models, gamma, sampling; a longer token limit."""
    from project.settings import add_engine_args as add

    add(p, default_max_new_tokens)
    for action in p._actions:  # a benchmark's wording of two of them
        if action.dest == "max_new_tokens":
            action.help = (f"generation limit per problem (default {default_max_new_tokens}); "
                           "hitting it counts as truncated")
        elif action.dest == "seed":
            action.help = "base seed of the sampler; problem i uses seed + i, whichever shard runs it (default 0)"


def engine_generators(engine: Any) -> dict[str, GenerateFn]:
    """Generators for the "spec" and "target" modes of one minitorch engine (generation/engine.py): speculative
    with a per-round log in its statistics, and the target alone with the same sampling and vocabulary."""
    alone = engine.alone()
    spec_settings = engine.spec

    def spec(prompt_ids: list[int], max_new_tokens: int, seed: int) -> Any:
        log = RoundLog()
        res = engine.generate(prompt_ids, max_new_tokens, seed=seed, on_tokens=log)
        first = int(res.stats.get("prefill_tokens", 0))  # the prefill's token came in a call of its own, no round
        stats = round_log_stats(log.emitted[1 if first else 0:], spec_settings.round_gamma, max_new_tokens,
                                spec_settings.adaptive, start=first)
        for k, v in stats.items():
            res.stats.setdefault(k, v)  # the engine's own per-round log, when it has one, wins
        return res

    def plain(prompt_ids: list[int], max_new_tokens: int, seed: int) -> Any:
        return alone.generate(prompt_ids, max_new_tokens, seed=seed)

    return {"spec": spec, "target": plain}


def load_engine(args: argparse.Namespace, modes: Sequence[str]) -> Engine:
    """Load the models the flags name (settings.resolve_settings, cli_common.load_models); generators for `modes`."""
    from project.cli_common import load_models
    from project.settings import resolve_settings

    settings = resolve_settings(args)
    # --no-progress quiets the loading bars too (a GPU log was mostly "dequantizing ..." bars)
    models = load_models(settings, progress=not getattr(args, "no_progress", False))
    s = models.settings
    engine = models.engine()
    warm = engine.warm_up(batch=s.batch)  # the first problem's timings stay warm
    print(f"[warm-up {warm:.1f} s, not part of any problem's timing]", file=sys.stderr)
    gens = engine_generators(engine)
    if any(m.startswith("hf_") for m in modes):
        from .hf import hf_generators

        gens.update(hf_generators(s.target, s.draft if s.drafter == "model" else None, s.sampling,
                                  sorted(models.stop_ids), gamma=s.gamma))
    return Engine(tokenizer=models.tokenizer, modes=gens, config=s.record(),
                  batch=batch_generator(engine, s.batch) if s.batch > 1 else None)
