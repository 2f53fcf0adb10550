"""Model / drafter / sampling flags of the benchmarks, and the generators they run.

Flags and model loading are run_spec_decoding.py's (project/cli_common.py). `load_engine(args, modes)`
loads the target (and draft) model, and returns
one generator per mode: "spec" (speculative_generate), "target" (generate, over the same shared
vocabulary), and with --compare-hf the transformers baselines "hf_greedy" / "hf_assisted"
(hf.py). Each generator takes (prompt_ids, max_new_tokens, seed), so a problem samples the
same way whichever shard runs it.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from .data import Tokenizer
from .runner import GenerateFn, RoundLog, round_log_stats

# --backend cuda flags that change speed (fast_verify also how a near-tie resolves), stored with the results
GPU_KNOBS = ("fast_verify", "gpu_gemv", "gpu_draft_gemv", "gpu_draft_weights", "gpu_prefill")


@dataclass
class Engine:
    """Generators per mode, the tokenizer that builds prompts, and the settings stored with results."""

    tokenizer: Tokenizer
    modes: dict[str, GenerateFn]
    config: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)


def add_engine_args(p: argparse.ArgumentParser, default_max_new_tokens: int) -> None:
    """The flags of run_spec_decoding.py (cli_common): models, gamma, sampling; a longer token limit."""
    from project.cli_common import add_model_args, add_sampling_args, add_spec_args

    add_model_args(p)
    add_spec_args(p)
    add_sampling_args(p)
    for action in p._actions:  # reasoning needs a longer limit than the demo's default
        if action.dest == "max_new_tokens":
            action.default = default_max_new_tokens
            action.help = (f"generation limit per problem (default {default_max_new_tokens}); "
                           "hitting it counts as truncated")
        elif action.dest == "seed":
            action.help = "base seed of the sampler; problem i uses seed + i, whichever shard runs it (default 0)"


def engine_generators(target: Any, drafter: Any, stop_ids: Sequence[int], cfg: Any, gamma: int,
                      adaptive: bool, vocab_size: int, functions: Any = None) -> dict[str, Any]:
    """Generators for the "spec" and "target" modes around one loaded target and drafter;
    functions = (generate, speculative_generate) of another engine (default: the CPU engine's)."""
    from minitorch.generation import generate, speculative_generate

    if functions is not None:
        generate, speculative_generate = functions

    def spec(prompt_ids: list[int], max_new_tokens: int, seed: int) -> Any:
        log = RoundLog()
        res = speculative_generate(target, drafter, prompt_ids, max_new_tokens, replace(cfg, seed=seed), stop_ids,
                                   gamma=gamma, adaptive_gamma=adaptive, vocab_size=vocab_size, on_tokens=log)
        for k, v in round_log_stats(log.emitted, gamma, max_new_tokens, adaptive).items():
            res.stats.setdefault(k, v)  # the engine's own per-round log, when it has one, wins
        return res

    def plain(prompt_ids: list[int], max_new_tokens: int, seed: int) -> Any:
        return generate(target, prompt_ids, max_new_tokens, replace(cfg, seed=seed), stop_ids, vocab_size=vocab_size)

    return {"spec": spec, "target": plain}


def load_engine(args: argparse.Namespace, modes: Sequence[str]) -> Engine:
    """Load the models named by the flags (cli_common.load_models); generators for `modes`."""
    from project.cli_common import check_spec_args, load_models, sampling_from_args, warm_up

    check_spec_args(args)
    cfg = sampling_from_args(args)
    # --no-progress quiets the loading bars too (a GPU log was mostly "dequantizing ..." bars)
    models = load_models(args, progress=not getattr(args, "no_progress", False))
    warm = warm_up(models, cfg=cfg, gamma=args.gamma, drafter=args.drafter)  # first problem's timings stay warm
    print(f"[warm-up {warm:.1f} s, not part of any problem's timing]", file=sys.stderr)
    stop_ids = sorted(models.stop_ids)
    drafter, round_gamma = models.round_drafter(args.drafter, args.gamma)
    gens = engine_generators(models.target, drafter, stop_ids, cfg, round_gamma, args.adaptive_gamma,
                             models.vocab_size, functions=models.functions())
    if any(m.startswith("hf_") for m in modes):
        from .hf import hf_generators

        gens.update(hf_generators(args.target, args.draft if args.drafter == "model" else None, cfg,
                                  stop_ids, gamma=args.gamma))
    return Engine(tokenizer=models.tokenizer, modes=gens, config=run_config(args))


def run_config(args: argparse.Namespace) -> dict[str, Any]:
    """The settings every result line carries (a resumed run must match them)."""
    config = {"target": str(args.target), "drafter": args.drafter,
              "draft": str(args.draft) if args.drafter == "model" else None, "gamma": args.gamma,
              "adaptive_gamma": bool(args.adaptive_gamma), "temperature": args.temperature, "top_k": args.top_k,
              "top_p": args.top_p, "seed": args.seed, "backend": args.backend, "dtype": args.dtype}
    if args.drafter == "head":  # which head drafted (its folder; the cache's default for the target when not given)
        config["head"] = str(args.head) if getattr(args, "head", None) else "default"
    if getattr(args, "draft_extend", 0):  # only when on, so earlier result files still resume
        config["draft_extend"] = args.draft_extend
    if args.backend == "cuda":  # which GPU paths ran; the cpu's settings stay as before, so its old results resume
        config["gpu"] = {k: getattr(args, k, None) for k in GPU_KNOBS}
    return config
