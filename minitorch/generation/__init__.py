"""Token generation on MiniTorch models: sampling, autoregressive and speculative decoding.

    engine.py          make_engine(target, DrafterSpec, sampling).generate(prompt_ids, n): the one call, either backend
    autoregressive.py  generate: the target alone (CPU engine)
    batch.py           run_batch: the target alone on many sequences at once (continuous batching); CpuSlots
    speculative.py     speculative_generate: draft, verify, accept, roll back (CPU engine; the acceptance rule)
    budget.py          CostBudget: how much each round drafts, from the measured acceptance and costs
    drafters.py        the Drafter protocol: ModelDrafter, NGramDrafter, ExtendedDrafter
    head_drafter.py    HeadDrafter: a trained draft head on the target's features (chains, and trees: propose_tree)
    tree.py            draft trees: DraftTree, EAGLE-2's selection, the reference verify (one path at a time)
    tree_decoding.py   tree_speculative_generate: a tree a round, verified in one target step (CPU engine, greedy)
    cuda.py            the CUDA-graph engine: the same functions over CudaDecoders, its GpuDrafter protocol
    sampling.py, stats.py   SamplingConfig and the sampler; the statistics every generation returns

See docs/ARCHITECTURE.md (the model and drafter protocols) and speculative.py for the acceptance rule.
"""
from .autoregressive import generate
from .batch import BatchRequest, BatchResult, CpuSlots, SlotBackend, run_batch
from .drafters import Drafter, ExtendedDrafter, ModelDrafter, NGramDrafter
from .engine import DrafterSpec, Engine, make_engine
from .sampling import SamplingConfig, logits_to_probs, sample
from .speculative import speculative_generate
from .stats import GenerationResult, predicted_speedup

__all__ = [
    "BatchRequest",
    "BatchResult",
    "CpuSlots",
    "Drafter",
    "DrafterSpec",
    "Engine",
    "GenerationResult",
    "ExtendedDrafter",
    "ModelDrafter",
    "NGramDrafter",
    "SamplingConfig",
    "SlotBackend",
    "generate",
    "logits_to_probs",
    "make_engine",
    "predicted_speedup",
    "run_batch",
    "sample",
    "speculative_generate",
]
