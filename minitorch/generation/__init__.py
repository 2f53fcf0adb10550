"""Token generation on MiniTorch models: sampling, autoregressive and speculative decoding.

See docs/ARCHITECTURE.md (the model and drafter protocols) and speculative.py for the acceptance rule.
"""
from .autoregressive import generate
from .drafters import Drafter, ExtendedDrafter, ModelDrafter, NGramDrafter
from .sampling import SamplingConfig, logits_to_probs, sample
from .speculative import speculative_generate
from .stats import GenerationResult, predicted_speedup

__all__ = [
    "Drafter",
    "GenerationResult",
    "ExtendedDrafter",
    "ModelDrafter",
    "NGramDrafter",
    "SamplingConfig",
    "generate",
    "logits_to_probs",
    "predicted_speedup",
    "sample",
    "speculative_generate",
]
