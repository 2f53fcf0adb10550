"""One engine for generation, whichever backend holds the target.

    from minitorch.generation.engine import DrafterSpec, make_engine
    engine = make_engine(target, DrafterSpec("model", model=draft, gamma=4), SamplingConfig(),
                         stop_ids=tok.stop_token_ids, vocab_size=tok.vocab_size)
    result = engine.generate(prompt_ids, max_new_tokens=128)   # speculative: the target's own output, faster
    alone = engine.alone().generate(prompt_ids, 128)           # the target alone, same sampling and vocabulary

The target decides the engine. A CPU model (models/qwen2.py) runs on the CPU engine (autoregressive.py,
speculative.py: sampling and acceptance on the host); a CudaDecoder (cuda/decoder.py, `CudaDecoder.from_model`)
runs on the CUDA-graph engine (cuda.py: every step a replayed graph, sampling and acceptance on the device). Both
take the same arguments and return the same GenerationResult, so nothing above this module asks which one runs.

A DrafterSpec says who proposes tokens in terms common to both engines:

    "none"   the target alone (plain autoregressive decoding)
    "model"  a draft model of the target's kind (a CPU model, or a draft CudaDecoder); with `extend` prompt lookup
             continues its gamma tokens by up to `extend` more (lossless; verify rows only); `propose_vocab` limits
             its proposals to the first n token ids (its LM head computes that slice)
    "ngram"  prompt lookup alone (NGramDrafter: no second model)
    "head"   a trained draft head (models/draft_head.py on the CPU; its cuda/head.py HeadDecoder on the GPU); greedy,
             `tree=(top_k, depth, budget)` drafts a tree a round instead of a chain (tree_decoding.py on the CPU,
             cuda_tree.py on the GPU); on the GPU, `extend` continues its gamma tokens by prompt lookup as the draft
             model's (summaries, passages: text the answer copies); `lookup=M` drafts a greedy round by prompt
             lookup instead of the head where an n-gram of M or more tokens matches (head_drafter.py; on the GPU
             kernels/lookup.cu ngram_select over the head's gathered drafts)

and `drafter_for` makes the engine's object for it: ModelDrafter / ExtendedDrafter / NGramDrafter / HeadDrafter on
the CPU (the Drafter protocol, drafters.py), DecoderDrafter / HostDrafter / HeadGpuDrafter on the GPU (the GpuDrafter
protocol, cuda.py). Whatever drafts, greedy output is the target's bit for bit where the verify step reproduces the
decode step's logits (the CPU engine always; the GPU's exact GEMVs, CudaDecoder's default), and sampled output
follows the target's distribution (speculative.py's acceptance rule).

`engine.generate_batch(requests, batch=N)` decodes many sequences with the target alone, N at once (continuous
batching: batch.py's run_batch over CpuSlots on the CPU, the target's batch decoder on the GPU), yielding each
BatchResult as its sequence finishes; one batch run at a time per engine (the backend is kept for the next call).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

from .autoregressive import TokenCallback, context_limit
from .batch import BatchRequest, BatchResult, CpuSlots, run_batch
from .drafters import LOOKUP_MAX_NGRAM
from .sampling import SamplingConfig
from .stats import GenerationResult

DRAFTER_KINDS = ("none", "model", "ngram", "head")
BATCH_MAX_LEN = 4096  # generate_batch's default cache positions a slot, when the model's context is longer (or unknown)
WARM_PROMPT_TOKENS = 128  # long enough for every prefill path: more than 16 rows (the packed kernel's
# BLAS rebuild) and past PARALLEL_ATTENTION_WORK (minitorch/cpu/ops.py: threaded attention) for 1.5B-class models


@dataclass(frozen=True)
class DrafterSpec:
    """Who proposes tokens, and how many a round (module docstring)."""

    kind: str = "none"
    model: Any = None  # "model": the draft model, on the target's backend
    head: Any = None  # "head": a DraftHead (CPU engine) or its HeadDecoder (CUDA-graph engine)
    gamma: int = 4  # tokens drafted a round (the model's own when extend > 0)
    extend: int = 0  # "model" (and "head" on the CUDA-graph engine): prompt-lookup tokens after the drafter's gamma
    lookup: int = 0  # "head", greedy rounds: prompt lookup first, where an n-gram of this many tokens or more (up to
    # 3) ending the context occurred before, the round drafts what followed it instead of the head's tokens
    lookup_min_prompt: int = 0  # "head" with lookup, CPU engine: look up only where the prompt has this many tokens
    propose_vocab: int = 0  # "model": propose among the first n token ids only; 0 = all
    adaptive: bool | str = False  # True: raise gamma after a fully accepted round, lower it after an early
    # rejection; "cost": each round drafts 0..gamma by the measured acceptance and costs (budget.py; CPU engine)
    prompt_window: int = 0  # "head", CPU engine: the head reads only the prompt's last this many positions (0: all)
    tree: Optional[tuple[int, int, int]] = None  # "head", greedy: a draft tree a round instead of a chain, (top_k,
    # depth, budget nodes): EAGLE-2's selection on the CPU engine (tree_decoding.py), a chain with alternatives on the
    # CUDA-graph engine (cuda_tree.py)

    def __post_init__(self) -> None:
        if self.kind not in DRAFTER_KINDS:
            raise ValueError(f"drafter kind must be one of {', '.join(DRAFTER_KINDS)}, got {self.kind!r}")
        for name in ("gamma", "extend", "propose_vocab", "lookup", "prompt_window", "lookup_min_prompt"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "gamma" else 0):
                raise ValueError(f"{name} must be an integer >= {1 if name == 'gamma' else 0}, got {v!r}")
        if self.kind == "model" and self.model is None:
            raise ValueError("a 'model' drafter needs its draft model (DrafterSpec(model=...))")
        if self.kind == "head" and self.head is None:
            raise ValueError("a 'head' drafter needs its draft head (DrafterSpec(head=...))")
        if self.adaptive not in (False, True, "cost"):
            raise ValueError(f"adaptive must be False, True or 'cost', got {self.adaptive!r}")
        if self.extend and self.kind not in ("model", "head"):
            raise ValueError("extend continues a draft model's or head's tokens by prompt lookup: it needs kind "
                             "'model' or 'head'")
        if self.lookup:
            if self.kind != "head":
                raise ValueError("lookup drafts by prompt lookup before a head: it needs kind 'head'")
            if self.lookup > LOOKUP_MAX_NGRAM:
                raise ValueError(f"lookup is the shortest n-gram matched, 1..{LOOKUP_MAX_NGRAM}, got {self.lookup}")
            if self.extend or self.tree is not None:
                raise ValueError("lookup (prompt lookup first) takes neither extend nor a tree")
        elif self.lookup_min_prompt:
            raise ValueError("lookup_min_prompt is where lookup runs: it needs lookup > 0")
        if self.tree is not None:
            if self.kind != "head":
                raise ValueError("a draft tree is drafted by a head: it needs kind 'head'")
            if len(self.tree) != 3 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in self.tree):
                raise ValueError(f"tree must be (top_k, depth, budget), integers >= 1, got {self.tree!r}")

    @property
    def round_gamma(self) -> int:
        """Tokens a round verifies at most: the drafter's gamma plus its looked-up ones."""
        return self.gamma + self.extend


def on_graphs(model: Any) -> bool:
    """Whether a model runs on the CUDA-graph engine (a CudaDecoder) rather than the CPU engine."""
    return bool(getattr(model, "graph_decoder", False))


def logit_count(model: Any) -> int:
    """How many logits a model's step returns (checkpoints pad their vocabularies differently)."""
    return int(model.V) if on_graphs(model) else int(model.config.vocab_size)


def batch_max_len(model: Any) -> int:
    """generate_batch's default max_len: the model's context (config.max_position_embeddings), at most BATCH_MAX_LEN
    positions (a long-context model would otherwise give every slot a cache of its whole context)."""
    return min(context_limit(model) or BATCH_MAX_LEN, BATCH_MAX_LEN)


def engine_functions(target: Any) -> tuple[Callable[..., GenerationResult], Callable[..., GenerationResult]]:
    """(generate, speculative_generate) of the engine that runs this target: same arguments, same results."""
    if on_graphs(target):
        from .cuda import generate_cuda, speculative_generate_cuda

        return generate_cuda, speculative_generate_cuda
    from .autoregressive import generate
    from .speculative import speculative_generate

    return generate, speculative_generate


def drafter_for(spec: DrafterSpec, target: Any, vocab_size: int) -> Any:
    """The engine's drafter object for a spec (None for "none"); fresh state, reusable across generations."""
    graphs = on_graphs(target)
    if spec.kind == "none":
        return None
    if spec.kind == "ngram":
        from .drafters import NGramDrafter

        return NGramDrafter()
    steps = spec.gamma if spec.extend else None
    if spec.kind == "head":
        if graphs:  # the head's GPU decoder (minitorch/cuda/head.py) over the target decoder
            from .cuda import HeadGpuDrafter

            if spec.lookup_min_prompt:
                raise ValueError("lookup_min_prompt is the CPU engine's: the CUDA-graph one looks up in every prompt")
            return HeadGpuDrafter(spec.head, lookup_steps=steps, lookup_first=spec.lookup)
        if steps:  # a CPU verify row costs a quarter of a step: looked-up rows are the gate's to price, not yet done
            raise ValueError("a head's drafts continued by prompt lookup (extend) run on the CUDA-graph engine only")
        from .head_drafter import HeadDrafter

        return HeadDrafter(spec.head, target, lookup=spec.lookup, prompt_window=spec.prompt_window,
                           lookup_min_prompt=spec.lookup_min_prompt)
    if on_graphs(spec.model) != graphs:
        raise ValueError("the draft model and the target must run on the same engine (both CudaDecoders or neither)")
    if graphs:
        from .cuda import DecoderDrafter

        return DecoderDrafter(spec.model, propose_vocab=spec.propose_vocab or None, lookup_steps=steps)
    from .drafters import ExtendedDrafter, ModelDrafter

    model = ModelDrafter(spec.model, vocab_size, head_vocab=spec.propose_vocab or None)
    return ExtendedDrafter(model, steps) if steps else model


class Engine:
    """A target, its drafter and the sampling settings: `generate(prompt_ids, max_new_tokens)`. Made by make_engine."""

    def __init__(self, target: Any, drafter: DrafterSpec, sampling: SamplingConfig, stop_ids: Iterable[int],
                 vocab_size: int) -> None:
        self.target, self.spec, self.sampling = target, drafter, sampling
        self.stop_ids = frozenset(int(s) for s in stop_ids)
        self.vocab_size = int(vocab_size)
        self.on_graphs = on_graphs(target)
        self._generate, self._speculative = engine_functions(target)
        self._drafter: Any = None
        self._batch: Optional[tuple[tuple[int, int], Any]] = None  # (batch, max_len) and its backend

    @property
    def drafter(self) -> Any:
        """The engine's drafter object (drafter_for), made on first use."""
        if self._drafter is None and self.spec.kind != "none":
            self._drafter = drafter_for(self.spec, self.target, self.vocab_size)
        return self._drafter

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, seed: Optional[int] = None,
                 on_tokens: Optional[TokenCallback] = None) -> GenerationResult:
        """Up to max_new_tokens tokens after prompt_ids (cut at a stop token): speculative unless the drafter is
        "none". seed: this generation's sampler seed instead of the settings' (a benchmark's problem i: seed + i)."""
        cfg = self.sampling if seed is None else replace(self.sampling, seed=seed)
        if self.spec.kind == "none":
            return self._generate(self.target, prompt_ids, max_new_tokens, cfg, self.stop_ids,
                                  vocab_size=self.vocab_size, on_tokens=on_tokens)
        if self.spec.tree is not None:
            top_k, depth, budget = self.spec.tree
            if self.on_graphs:  # a chain with alternatives a depth (cuda_tree.py)
                from .cuda_tree import tree_speculative_generate_cuda

                return tree_speculative_generate_cuda(self.target, self.drafter, prompt_ids, max_new_tokens, top_k,
                                                      depth, budget, cfg, self.stop_ids, self.vocab_size, on_tokens)
            from .tree_decoding import tree_speculative_generate

            return tree_speculative_generate(self.target, self.drafter, prompt_ids, max_new_tokens, top_k, depth,
                                             budget, cfg, self.stop_ids, self.vocab_size, on_tokens,
                                             adaptive="cost" if self.spec.adaptive == "cost" else False)
        return self._speculative(self.target, self.drafter, prompt_ids, max_new_tokens, cfg, self.stop_ids,
                                 gamma=self.spec.round_gamma, adaptive_gamma=self.spec.adaptive,
                                 vocab_size=self.vocab_size, on_tokens=on_tokens)

    def generate_batch(self, requests: Iterable[Optional[BatchRequest]], batch: int, max_len: Optional[int] = None,
                       progress: Any = None) -> Iterator[BatchResult]:
        """The target alone on `batch` sequences at once (continuous batching, batch.py's run_batch): each request's
        BatchResult as its sequence finishes, out of order (BatchResult.index: its place in the input). A request's
        sampling None takes the engine's. Only the target alone batches: speculative decoding stays one sequence at
        a time (a drafter other than "none" is refused). max_len: the cache positions of each slot, which every
        request's prompt + max_new_tokens must fit; requests are read lazily, so it is fixed before the first one:
        default `batch_max_len(target)` = the model's context, capped at BATCH_MAX_LEN positions. The backend: CpuSlots
        on the CPU engine (the reference; rows one after another), the target's `batch_decoder(slots, max_len,
        vocab_size)` on the CUDA-graph engine; the engine keeps the last one made for the next call."""
        if self.spec.kind != "none":
            raise ValueError(f"batched decoding runs the target alone; this engine drafts with {self.spec.kind!r} "
                             "(speculative decoding runs one sequence at a time: use engine.alone())")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
        n = batch_max_len(self.target) if max_len is None else max_len
        if self._batch is None or self._batch[0] != (batch, n):
            self._batch = None  # the old backend's memory goes before the new one's is taken
            if self.on_graphs:
                backend = self.target.batch_decoder(slots=batch, max_len=n, vocab_size=self.vocab_size)
            else:
                backend = CpuSlots(self.target, batch, n, self.vocab_size)
            self._batch = ((batch, n), backend)
        return run_batch(self._batch[1], requests, self.sampling, self.stop_ids, progress)

    def alone(self, model: Any = None) -> "Engine":
        """An engine of `model` (default: the target) alone, with these sampling settings and vocabulary: the
        baseline a speculative run is measured against, or the draft model's own output."""
        return Engine(model if model is not None else self.target, DrafterSpec(), self.sampling, self.stop_ids,
                      self.vocab_size)

    def warm_up(self, prompt_ids: Optional[Sequence[int]] = None, batch: int = 1) -> float:
        """Run each generation path once, briefly, before anything is timed: the target alone and (with a draft
        model) the draft alone for 3 tokens, and a speculative generation of a few rounds, on a
        WARM_PROMPT_TOKENS-token prompt (prompt_ids repeated or cut; at most what the contexts leave). First-run
        costs (numba compiling each kernel variant, weights paged in, CUDA graphs captured, including those of a
        run's last, shorter rounds) then fall on the warm-up, not on whichever timed generation runs first.
        batch > 1 (the target alone): also `batch` such 3-token sequences through generate_batch(batch), a full
        admission and the batch's steps, on the backend the run's own generate_batch (default max_len) then reuses.
        Returns its seconds."""
        t0 = time.perf_counter()
        spec = self.spec
        total = spec.round_gamma if spec.kind != "none" else 1
        new = 2 * total + 2
        models = [self.target] + ([spec.model] if spec.kind == "model" else [])
        limits = [lim for lim in (context_limit(m) for m in models) if lim]
        n = max(1, min([WARM_PROMPT_TOKENS] + [lim - new - 1 for lim in limits]))
        base = [int(t) for t in (prompt_ids or [])] or [3 + i % max(self.vocab_size - 3, 1) for i in range(n)]
        ids = (base * (n // len(base) + 1))[:n]
        for model in models:
            self.alone(model).generate(ids, 3)
        if spec.kind != "none":
            self.generate(ids, new)
            if self.on_graphs and spec.tree is not None:
                from .cuda_tree import capture_tree_graphs

                capture_tree_graphs(self.target, self.drafter, ids, *spec.tree, vocab_size=self.vocab_size)
            elif self.on_graphs and spec.kind in ("model", "head"):
                from .cuda import capture_speculative_graphs

                capture_speculative_graphs(self.target, self.drafter, ids, total, self.sampling,
                                           vocab_size=self.vocab_size)
        if batch > 1:
            for _ in self.generate_batch([BatchRequest(ids, 3)] * batch, batch):
                pass
        return time.perf_counter() - t0


def make_engine(target: Any, drafter: DrafterSpec | str = "none", sampling: Optional[SamplingConfig] = None,
                stop_ids: Iterable[int] = (), vocab_size: Optional[int] = None) -> Engine:
    """The engine for a loaded target (a CPU model or a CudaDecoder) and a drafter ("none", "ngram", or a
    DrafterSpec). vocab_size: candidate tokens are the first vocab_size logits; default and upper bound: the
    vocabulary the target and a draft model share (the smaller logit count). Pass the tokenizer's vocabulary size
    too, so no padding row of a checkpoint's embedding is ever chosen."""
    spec = drafter if isinstance(drafter, DrafterSpec) else DrafterSpec(kind=drafter)
    counts = [logit_count(target)] + ([logit_count(spec.model)] if spec.kind == "model" else [])
    vocab = min(counts + ([int(vocab_size)] if vocab_size else []))
    return Engine(target, spec, sampling or SamplingConfig(), stop_ids, vocab)
