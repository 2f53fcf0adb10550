"""Optional baselines for --compare-hf: transformers greedy (or sampled) generation and assisted
generation (transformers' speculative decoding) on the same models and the same prompt token ids.

Only imported when asked; needs torch and transformers (test/baseline dependencies, never used by
minitorch/). Models are resolved with minitorch.models.registry (a registry name, an HF folder or a
.gguf file, which transformers dequantizes on load: slow, about two minutes for the offline pair).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .data import BenchmarkError


@dataclass
class HFResult:
    """The GenerationResult shape for a transformers run (no acceptance statistics)."""

    tokens: list[int]
    stop_reason: str
    stats: dict[str, Any] = field(default_factory=dict)


def load_hf_model(name_or_path: str, cache_dir: str | None = None) -> Any:
    """A transformers causal LM in float32 (eval mode) from a registry name, HF folder or .gguf file."""
    import torch
    from transformers import AutoModelForCausalLM

    from minitorch.models.registry import resolve

    path = Path(resolve(name_or_path, cache_dir))
    if path.is_file() and path.suffix == ".gguf":
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return model.eval()


def hf_generators(target: str, draft: str | None, cfg: Any, stop_ids: Sequence[int], gamma: int = 4,
                  cache_dir: str | None = None) -> dict[str, Any]:
    """Generators for "hf_greedy" (target alone) and "hf_assisted" (target + draft, constant gamma)."""
    try:
        import torch
        import transformers  # noqa: F401  (checked here for a clear message)
    except ImportError:
        raise BenchmarkError("--compare-hf needs torch and transformers (pip install -r requirements.extra.txt)") from None
    if draft is None:
        raise BenchmarkError("--compare-hf needs a draft model (--drafter model) for assisted generation")
    target_model = load_hf_model(target, cache_dir)
    draft_model = load_hf_model(draft, cache_dir)
    draft_model.generation_config.num_assistant_tokens = gamma
    draft_model.generation_config.num_assistant_tokens_schedule = "constant"
    stops = [int(s) for s in stop_ids]

    def run(prompt_ids: list[int], max_new_tokens: int, seed: int, assistant: Any) -> HFResult:
        torch.manual_seed(seed)
        ids = torch.tensor([prompt_ids], dtype=torch.long)
        kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens, "eos_token_id": stops,
                                  "pad_token_id": stops[0] if stops else None,
                                  "attention_mask": torch.ones_like(ids)}
        if cfg.temperature > 0:
            kwargs.update(do_sample=True, temperature=cfg.temperature, top_k=cfg.top_k or None, top_p=cfg.top_p)
        else:
            kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        if assistant is not None:
            kwargs["assistant_model"] = assistant
        with torch.no_grad():
            out = target_model.generate(ids, **kwargs)
        tokens = [int(t) for t in out[0, len(prompt_ids):]]
        stop = "stop" if tokens and tokens[-1] in stops else "length"
        return HFResult(tokens=tokens, stop_reason=stop)

    return {
        "hf_greedy": lambda p, n, s: run(p, n, s, None),
        "hf_assisted": lambda p, n, s: run(p, n, s, draft_model),
    }
