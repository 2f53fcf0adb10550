"""The programs' shared flags, and the one place they become settings.

    add_model_args(p), add_spec_args(p), add_sampling_args(p)    the flags (every program that generates)
    add_batch_args(p)                                            --batch (the text writers and the benchmarks)
    settings = resolve_settings(args)                            every value checked, defaults filled: frozen
    settings = settings.for_head(folder)                         after the target is loaded: --drafter auto

`resolve_settings` is the only reader of these flags: nothing writes the namespace, and every later decision
reads the frozen Settings. What needs the loaded target (whether the cache holds a draft head for it, which
--drafter auto then takes) is the one step left for later, `Settings.for_head`, a pure function of the settings
and that folder. Each setting has one default, here: `default_gamma` and `default_extend` are the tables of the
draft length and of --draft-extend by drafter and engine; the GPU's kernels default to the exact verify
(CudaDecoder's "auto") unless --fast-verify or --gpu-gemv asks otherwise.

A bad value is a UserError (a ValueError) naming the flag: the programs print it as one line and exit 2.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from minitorch.generation import SamplingConfig

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"


class UserError(ValueError):
    """A mistake the user can fix; shown as one line."""


# ----------------------------------------------------------------------------------------------------- the flags

def add_model_args(p: argparse.ArgumentParser) -> None:
    """--target, --draft, --drafter, --head, --backend, --dtype, --weights and the engines' knobs."""
    g = p.add_argument_group("models")
    g.add_argument("--target", default=DEFAULT_TARGET,
                   help=f"target model: registry name, HF model folder or GGUF file (default {DEFAULT_TARGET})")
    g.add_argument("--draft", default=DEFAULT_DRAFT,
                   help=f"draft model for --drafter model: registry name, folder or GGUF file (default {DEFAULT_DRAFT})")
    g.add_argument("--drafter", choices=("auto", "model", "ngram", "head"), default="auto",
                   help="who proposes tokens: the draft model, prompt lookup (n-gram match, no second model), or a "
                   "draft head trained for the target (project/train_draft_head.py). auto (default): the head when "
                   "--head is given or the cache holds one for this target and no flag of the draft model's is "
                   "given, else the draft model (gamma defaults: settings.default_gamma)")
    g.add_argument("--head", default=None, metavar="DIR",
                   help="the draft head's folder for --drafter head or auto (default: the cache's head for this target, "
                        "else the one the repository ships for it in heads/)")
    g.add_argument("--backend", choices=("cpu", "cuda"), default="cpu",
                   help="where the models run: cpu (numba) or cuda (our kernels; needs a GPU and CuPy)")
    g.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                   help="auto (default): float32 on the cpu; on cuda bfloat16 through the CUDA-graph decoder "
                        "(minitorch/cuda/decoder.py: sampling and acceptance on the device). float32 on cuda: the "
                        "generic op-by-op CUDA backend")
    g.add_argument("--fast-verify", action="store_true",
                   help="cuda: verify drafts with cuBLAS tensor cores (cheaper verify steps; a near-tie between two "
                        "logits may then resolve differently than in the target-alone run). Default: an exact GEMV, "
                        "whose verify steps reproduce the decode steps' logits bit for bit")
    g.add_argument("--gpu-gemv", choices=("auto", "tc", "ours"), default="auto",
                   help="cuda, exact verify: the products of decode and verify steps in our tensor-core GEMV (tc: "
                        "one mma kernel for 1..16 tokens) or our CUDA-core GEMV (ours); both give a verify step "
                        "the decode steps' bits. auto (default): tc on GPUs of compute capability >= 8.0")
    g.add_argument("--gpu-draft-gemv", choices=("auto", "ours", "ourstc"), default="auto",
                   help="cuda: the draft's products: ours = our CUDA-core GEMV for every step; ourstc = one-token "
                        "steps in it, steps of 2..16 tokens (a round's first draft step after a full acceptance) in "
                        "the tensor-core GEMV; auto (default): ourstc on GPUs of compute capability >= 8.0. With "
                        "--fast-verify the draft's longer steps use cuBLAS. Never changes the output")
    g.add_argument("--gpu-draft-weights", choices=("auto", "bf16", "int8"), default="auto",
                   help="cuda: the draft's (a draft model's or a head's) one-token steps read bf16 weights or 8-bit "
                        "copies of every projection and of the LM head (a head's: its head_vocab rows), one scale a "
                        "row (kernels/gemv.cu gemv1*_i8; half the bytes); auto (default): int8 where the draft's "
                        "shapes allow it (sizes multiples of 16). The draft only proposes tokens, so this changes "
                        "speed and acceptance, never the output")
    g.add_argument("--gpu-prefill", choices=("eager", "graph"), default="graph",
                   help="cuda: fill the prompt's cache with one captured graph a chunk of up to 128 tokens, the chunk "
                        "padded (default; CudaDecoder.fill_cache) or with eager steps. The chunks' row counts differ, "
                        "so cuBLAS may round the prompt's cache differently and a near-tie may resolve differently "
                        "between the two; within one setting speculative output equals the target alone's")
    g.add_argument("--draft-quant", choices=("auto", "q4", "file"), default="auto",
                   help="cpu, packed GGUF draft: q4 = the draft's 6- and 8-bit-code tensors requantized to 4 bits once "
                        "(fewer bytes a draft step reads; the draft's weights change only how many drafts are "
                        "accepted, never the output); file = as the file stores them; auto (default): q4 for a "
                        "packed GGUF draft on the cpu")
    g.add_argument("--cpu-activations", choices=("auto", "float32", "int8"), default="auto",
                   help="cpu, packed weights: the activations of every product; int8: rounded per block as llama.cpp "
                        "does (AVX2 or AVX512-VNNI integer dot products; a 5-row verify costs about 1.4 steps instead "
                        "of 2.7, so speculative decoding gains); float32: the exact reference (what the oracle tests "
                        "check); auto (default): int8 where the CPU has those instructions, else float32. "
                        "Speculative output equals the target alone's in the same mode")
    g.add_argument("--weights", choices=("auto", "packed", "float32"), default="auto",
                   help="packed: a GGUF's tensors kept as the file's int8 codes + block scales (same values, ~1/3 "
                        "of the memory, faster on the cpu); float32: expanded to float32; auto (default): packed "
                        "for GGUF files on the cpu, else float32")


def add_sampling_args(p: argparse.ArgumentParser, default_max_new_tokens: int = 128) -> None:
    """--max-new-tokens, --temperature, --top-k, --top-p, --seed."""
    g = p.add_argument_group("sampling")
    g.add_argument("--max-new-tokens", type=int, default=default_max_new_tokens,
                   help=f"new tokens to generate at most (default {default_max_new_tokens})")
    g.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 = greedy (default 0)")
    g.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens; 0 = off (default 0)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1]; 1 = off (default 1)")
    g.add_argument("--seed", type=int, default=0, help="random seed of the sampler (default 0)")


def add_spec_args(p: argparse.ArgumentParser) -> None:
    """--gamma, --adaptive-gamma, --draft-budget, --draft-vocab, --draft-tree, --draft-extend, --draft-lookup."""
    g = p.add_argument_group("speculative decoding")
    g.add_argument("--gamma", type=int, default=None,
                   help="tokens drafted a round (default by drafter and engine, settings.default_gamma: 4; 3 for a "
                        "draft head on the CPU and 6 on the CUDA-graph path, and 3 for the draft model on the "
                        "CUDA-graph path where the default --draft-extend adds 4 looked-up tokens)")
    g.add_argument("--adaptive-gamma", action="store_true",
                   help="raise gamma after a fully accepted draft, lower it after an early rejection (instead of "
                        "--draft-budget)")
    g.add_argument("--draft-budget", choices=("auto", "fixed", "cost"), default="auto",
                   help="how much each round drafts: fixed = gamma every round; cost = 0..gamma, whichever the "
                        "measured acceptance and draft / verify seconds make fastest, 0 being a plain target step "
                        "(minitorch/generation/budget.py: never much slower than the target alone; 1..gamma on the "
                        "CUDA-graph engine, where a verify row costs little); auto (default): cost, except fixed on "
                        "the CUDA-graph engine for a draft model, a draft tree or --draft-extend (settings."
                        "default_budget)")
    g.add_argument("--draft-vocab", type=int, default=0,
                   help="the draft model proposes only among the first N token ids (BPE ids run roughly by "
                        "frequency), computing that slice of its vocabulary projection; lossless; 0 = all")
    g.add_argument("--draft-tree", default=None, metavar="K,D,N",
                   help="the draft head proposes a tree a round instead of a chain, all of it verified in one target "
                        "step whose rows see only their own ancestors; greedy. CPU engine: the K most probable tokens "
                        "under each of the K best nodes of a level, D levels, the N best nodes kept (EAGLE-2's "
                        "selection; minitorch/generation/tree_decoding.py); with the draft budget each drafting round "
                        "drafts the tree or the chain of depth D, whichever has cost fewer seconds a token so far. "
                        "CUDA-graph engine: a chain of D head drafts with up to K - 1 alternatives a depth from the "
                        "head's own top-K lists (leaves, depth 1 first), N nodes in all (K <= 8, N >= D; "
                        "minitorch/generation/cuda_tree.py; exact; on one H100 with 3,6,15 GSM8K first 20 2.54x "
                        "against the chain's 2.45x, MATH-500 2.35x against 2.49x: docs/RESULTS.md). Default: none "
                        "(chains)")
    g.add_argument("--draft-extend", type=int, default=None, metavar="N",
                   help="after the draft model's (or, on the CUDA-graph path, the draft head's) gamma tokens, up "
                        "to N more by prompt lookup (the n-gram continuation of context + drafts: no draft forward, "
                        "only verify rows; lossless). "
                        "Default (settings.default_extend): 4 on the CUDA-graph path with a draft model, an exact "
                        "tensor-core verify and a fixed gamma (GSM8K on an H200: 1.68x the target alone vs 1.44x "
                        "for gamma 4 without); 0 elsewhere (on the CPU it did not pay: 1.11x vs 1.14x)")
    g.add_argument("--draft-lookup", type=int, default=None, metavar="M",
                   help="the draft head's greedy rounds: prompt lookup where the context's last M or more "
                        "tokens (up to 3) occurred before: the round drafts what followed them instead of the "
                        "head's tokens (summaries, answers from given passages, rewrites copy their context); on the "
                        "CPU only where more of them are expected accepted than of the head's (its confidence, the "
                        "run's measured rates), on the GPU wherever they match; lossless; 0 = off. Default "
                        f"(settings.default_lookup): {HEAD_LOOKUP_GPU} on the CUDA-graph engine (all of Spec-Bench "
                        "on an H100 1.81x against 1.50x without, GSM8K 2.02x against 2.07x), "
                        f"{HEAD_LOOKUP_CPU} on the CPU in prompts of {HEAD_LOOKUP_CPU_MIN_PROMPT} tokens or more, "
                        "none in shorter ones (Spec-Bench's long prompts 1.12x against 1.05x, summarization 1.21x "
                        "against 1.08x; the README's demo, a short prompt, 1.47-1.72x against 1.75-1.93x); given, "
                        "it looks up in every prompt: docs/RESULTS.md")


def add_batch_args(p: argparse.ArgumentParser) -> None:
    """--batch: the target alone on N sequences at once (the programs that write many answers)."""
    p.add_argument("--batch", type=int, default=1, metavar="N",
                   help="decode N sequences at once with the target alone (continuous batching, "
                        "minitorch/generation/batch.py; on the GPU one step serves all N, on the CPU it is no "
                        "faster); each answer is written as it finishes, out of order, and its tokens/s is its share "
                        "of steps shared with the others, not comparable to batch 1. N > 1 takes no drafter and no "
                        "draft flag. Default 1: one at a time, speculative as the flags say")


def add_engine_args(p: argparse.ArgumentParser, default_max_new_tokens: int = 128) -> None:
    """All three groups, as every program that generates takes them."""
    add_model_args(p)
    add_spec_args(p)
    add_sampling_args(p, default_max_new_tokens)


# --------------------------------------------------------------------------------------------- the settings

@dataclass(frozen=True)
class GpuSettings:
    """--backend cuda's kernel flags as given (they change speed; fast_verify also how a near-tie resolves)."""

    fast_verify: bool = False
    gemv: str = "auto"
    draft_gemv: str = "auto"
    draft_weights: str = "auto"
    prefill: str = "graph"

    @property
    def target_mode(self) -> str:
        """The target CudaDecoder's gemv: "auto" (the exact GEMV the GPU runs best), tc, ours; ours1 = --fast-verify."""
        return "ours1" if self.fast_verify else self.gemv

    @property
    def draft_mode(self) -> str:
        """A draft model's or head's gemv: "draft" (its fastest at each step size) unless asked; ours1 with
        --fast-verify (its longer steps in cuBLAS too)."""
        return "ours1" if self.fast_verify else ("draft" if self.draft_gemv == "auto" else self.draft_gemv)

    def record(self) -> dict[str, Any]:
        """The flags as the results files store them."""
        return {"fast_verify": self.fast_verify, "gpu_gemv": self.gemv, "gpu_draft_gemv": self.draft_gemv,
                "gpu_draft_weights": self.draft_weights, "gpu_prefill": self.prefill}


@dataclass(frozen=True)
class Settings:
    """What a run does, every value checked (resolve_settings). gamma / extend None and drafter "auto": not yet
    decided (for_head, once the target is loaded); after it each holds what runs. drafter "none" (the target alone)
    is what --batch N > 1 runs; no flag asks for it otherwise."""

    target: str = DEFAULT_TARGET
    draft: str = DEFAULT_DRAFT
    drafter: str = "auto"
    head: Optional[str] = None
    backend: str = "cpu"
    dtype: str = "auto"
    weights: str = "auto"
    cpu_activations: Optional[str] = None  # int8 | float32; None: the process's mode (a bench switching it itself)
    draft_quant: str = "auto"
    gpu: GpuSettings = field(default_factory=GpuSettings)
    gamma: Optional[int] = None
    extend: Optional[int] = None
    lookup: Optional[int] = None  # --draft-lookup: None until for_head decides it (default_lookup)
    lookup_min_prompt: int = 0  # the CPU engine's default lookup runs only in prompts of this many tokens (for_head)
    draft_vocab: int = 0
    adaptive: bool | str = False  # True: --adaptive-gamma; "cost": the draft budget (default_budget)
    budget: str = "auto"  # --draft-budget as given: for_head decides auto once the drafter is known
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_new_tokens: int = 128
    batch: int = 1  # --batch: sequences decoded at once, the target alone (drafter "none") when > 1
    tree: Optional[tuple[int, int, int]] = None  # --draft-tree K,D,N: a draft tree a round (the head, greedy, CPU)

    @property
    def graphs(self) -> bool:
        """Whether the models run as CUDA-graph decoders (--backend cuda, bf16) rather than on a TensorBackend."""
        return self.backend == "cuda" and self.dtype != "float32"

    @property
    def model_flags(self) -> bool:
        """Whether a flag of the draft model's was given (it then drafts, whatever the cache holds)."""
        return self.draft != DEFAULT_DRAFT or bool(self.extend) or bool(self.draft_vocab)

    @property
    def needs_draft(self) -> bool:
        return self.drafter == "model"

    def with_budget(self, drafter: str) -> "Settings":
        """adaptive decided for this drafter (default_budget; --adaptive-gamma stays True): once from the flags, again
        in for_head when --drafter auto is decided."""
        if self.adaptive is True:
            return self
        shaped = bool(self.extend) or self.tree is not None
        return replace(self, adaptive=default_budget(self.budget, self.graphs, drafter, shaped))

    def for_head(self, folder: Optional[Path]) -> "Settings":
        """The settings with --drafter auto decided and the defaults of gamma and --draft-extend filled in:
        auto drafts with the head in `folder` (--head, or the cache's head for the target, else the repository's;
        None: there is none)
        unless a flag of the draft model's was given, else with the draft model. The one step after loading."""
        drafter = self.drafter
        if drafter == "auto":
            drafter = "head" if folder is not None and not self.model_flags else "model"
        if self.tree is not None and drafter != "head":
            raise UserError("--draft-tree is drafted by a draft head, and none is found for this target (--head DIR)")
        if self.lookup and drafter != "head":
            raise UserError("--draft-lookup comes before a draft head's drafts, and none is found for this target "
                            "(--head DIR)")
        s = self.with_budget(drafter)
        extend = s.extend if s.extend is not None else default_extend(drafter, s)
        gamma = s.gamma if s.gamma is not None else default_gamma(drafter, s.graphs, extend if s.extend is None else 0)
        lookup = s.lookup if s.lookup is not None else default_lookup(drafter, s, extend)
        # the default's prompt length; --draft-lookup M given looks up in every prompt
        min_prompt = HEAD_LOOKUP_CPU_MIN_PROMPT if s.lookup is None and lookup and not s.graphs else 0
        return replace(s, drafter=drafter, extend=extend, gamma=gamma, lookup=lookup, lookup_min_prompt=min_prompt)

    def record(self) -> dict[str, Any]:
        """The settings every benchmark result line carries (a resumed run must match them)."""
        c = self.sampling
        drafts = self.drafter != "none"
        config: dict[str, Any] = {
            "target": self.target, "drafter": self.drafter, "draft": self.draft if self.drafter == "model" else None,
            "gamma": self.gamma if drafts else None, "adaptive_gamma": self.adaptive if drafts else False,
            "temperature": c.temperature, "top_k": c.top_k, "top_p": c.top_p, "seed": c.seed, "backend": self.backend,
            "dtype": self.dtype}
        if self.batch > 1:  # only when on, so earlier result files still resume
            config["batch"] = self.batch
        if self.drafter == "head":  # which head drafted (its folder; the cache's default for the target when not given)
            config["head"] = self.head or "default"
        if self.extend:  # only when on, so earlier result files still resume
            config["draft_extend"] = self.extend
        if self.tree and self.drafter == "head":  # likewise
            config["draft_tree"] = list(self.tree)
        if self.lookup and self.drafter == "head":  # likewise
            config["draft_lookup"] = self.lookup
            if self.lookup_min_prompt:
                config["draft_lookup_min_prompt"] = self.lookup_min_prompt
        if self.backend == "cuda":  # which GPU paths ran; the cpu's settings stay as before, so its old results resume
            config["gpu"] = self.gpu.record()
        return config


GAMMA = 4  # tokens drafted a round, unless the table below says otherwise
HEAD_CPU_GAMMA = 3  # a draft head on the CPU engine: GSM8K first 20, 1.56x at 3 against 1.44x at 4 (docs/RESULTS.md)
HEAD_GPU_GAMMA = 6  # ... on the CUDA-graph engine, where a verify row now costs ~1% of a step (SPLIT_NORM_FROM), on one
# H100 with the cost budget: GSM8K first 20 2.37x at 6 against 2.29x at 4, MATH-500 first 20 2.42x against 2.23x,
# Spec-Bench's 480 2.06x against 2.00x (docs/results/h100_split_norm/)
GPU_MODEL_GAMMA, GPU_MODEL_EXTEND = 3, 4  # the 0.5B on the CUDA-graph engine: 8 verify rows, the best measured
# --draft-lookup's default with a head's greedy chains, by engine. The CUDA-graph engine: 2. All 480 Spec-Bench questions
# on one H100 ran 1.81x our target alone with it against 1.50x without (summarization 2.24x against 1.20x, rag 1.63x
# against 1.33x, no question below 0.95x against one), GSM8K first 20 2.02x against 2.07x
# (docs/results/h100_lookup_specbench/). The CPU engine: 2 in prompts of HEAD_LOOKUP_CPU_MIN_PROMPT tokens or more
# (summaries, passages, long extractions), none in shorter ones. With its rounds chosen by expected acceptance
# (head_drafter.py) M = 2 ran Spec-Bench (first 3 of each category, first turns, 128 tokens, a 2-core Zen 3) at 1.19x
# against 1.13x without (docs/results/cpu_zen3_lookup_choice/), but the README's demo prompt (short: a word problem)
# ran 1.44-1.47x against 1.57-1.61x: two looked-up rounds among its first four fail and the gated budget goes plain for
# 9 rounds; again with stage 5 of the head (2026-12-07, Zen 4: 1.47-1.72x against 1.75-1.93x). Spec-Bench's long
# prompts with stage 5 (summarization, rag, extraction, first 10 each, first turns: 422-1,154, 671-818 and 174-385
# tokens) 1.115x with M = 2 against 1.047x without; summarization 1.21x against 1.08x
# (docs/results/cpu_zen4_lookup_long_prompts/)
HEAD_LOOKUP_GPU, HEAD_LOOKUP_CPU, HEAD_LOOKUP_CPU_MIN_PROMPT = 2, 2, 256


def default_budget(budget: str, graphs: bool, drafter: str = "auto", shaped: bool = False) -> bool | str:
    """--draft-budget as the engine takes it (DrafterSpec.adaptive). auto is the cost budget
    (minitorch/generation/budget.py), on the CPU engine always, and on the CUDA-graph engine for a draft head's chain:
    Spec-Bench's 480 questions on one H100 ran 1.31x there against 1.20x at a fixed gamma 4, 4 questions below 0.95x
    against 115, and GSM8K-style math_reasoning 1.75x against 1.81x (docs/RESULTS.md). A fixed gamma on that engine for
    the draft model, a tree or --draft-extend (`shaped`), whose budget is unmeasured there (asked for by name)."""
    if budget == "auto":
        budget = "cost" if not graphs or (drafter == "head" and not shaped) else "fixed"
    return "cost" if budget == "cost" else False


def default_gamma(drafter: str, graphs: bool, default_extend: int = 0) -> int:
    """--gamma's default, by drafter and engine: the one table of it."""
    if drafter == "head":
        return HEAD_GPU_GAMMA if graphs else HEAD_CPU_GAMMA
    if drafter == "model" and graphs and default_extend:
        return GPU_MODEL_GAMMA
    return GAMMA


def default_lookup(drafter: str, s: Settings, extend: int = 0) -> int:
    """--draft-lookup's default: HEAD_LOOKUP_GPU (the CUDA-graph engine) or HEAD_LOOKUP_CPU for a head's greedy
    chains (not a tree, not --draft-extend); 0 elsewhere. On the CPU engine for_head limits the default to prompts of
    HEAD_LOOKUP_CPU_MIN_PROMPT tokens or more (Settings.lookup_min_prompt)."""
    on = drafter == "head" and s.tree is None and not extend and s.sampling.greedy
    return (HEAD_LOOKUP_GPU if s.graphs else HEAD_LOOKUP_CPU) if on else 0


def default_extend(drafter: str, s: Settings) -> int:
    """--draft-extend's default: GPU_MODEL_EXTEND with the draft model on the CUDA-graph engine when its verify runs
    on tensor cores (not --gpu-gemv ours: there 8 rows cost 1.05x vs 1.45x) and gamma is fixed; 0 elsewhere."""
    on = drafter == "model" and s.graphs and s.gpu.target_mode != "ours" and not s.adaptive
    return GPU_MODEL_EXTEND if on else 0


def resolve_settings(args: argparse.Namespace) -> Settings:
    """The frozen Settings of the parsed flags (add_engine_args'), every value checked before anything loads. The
    only function that reads them. A namespace without some flag (a bench's own) takes that setting's default."""
    d = Settings()
    get = lambda name, default: getattr(args, name, default)  # noqa: E731
    backend, dtype = get("backend", d.backend), get("dtype", d.dtype)
    drafter = get("drafter", d.drafter)
    gamma, extend = get("gamma", None), get("draft_extend", None)
    max_new, draft_vocab = get("max_new_tokens", d.max_new_tokens), get("draft_vocab", 0)
    batch = get("batch", 1)
    if batch < 1:
        raise UserError(f"--batch must be >= 1, got {batch}")
    if batch > 1:  # the target alone: no flag of speculative decoding's
        given = [f"--drafter {drafter}" if drafter != "auto" else "", "--head" if get("head", None) else "",
                 "--draft" if get("draft", d.draft) != d.draft else "", "--gamma" if gamma is not None else "",
                 "--draft-extend" if extend is not None else "", "--draft-vocab" if draft_vocab else "",
                 "--draft-tree" if get("draft_tree", None) else "",
                 "--draft-lookup" if get("draft_lookup", None) else "",
                 "--adaptive-gamma" if get("adaptive_gamma", False) else "",
                 f"--draft-budget {get('draft_budget', 'auto')}" if get("draft_budget", "auto") != "auto" else ""]
        flag = next((f for f in given if f), None)
        if flag:
            raise UserError(f"--batch {batch} decodes the target alone, {batch} sequences at once; {flag} is for "
                            "speculative decoding, which runs one sequence at a time: drop it or use --batch 1")
        drafter = "none"
    if gamma is not None and gamma < 1:
        raise UserError(f"--gamma must be >= 1, got {gamma}")
    if max_new < 1:
        raise UserError(f"--max-new-tokens must be >= 1, got {max_new}")
    if draft_vocab < 0:
        raise UserError(f"--draft-vocab must be >= 0, got {draft_vocab}")
    if extend is not None and extend < 0:
        raise UserError(f"--draft-extend must be >= 0, got {extend}")
    if extend and drafter not in ("model", "head", "auto"):
        raise UserError("--draft-extend continues a draft model's or head's tokens: it needs --drafter model or head")
    if extend and drafter == "head" and not (backend == "cuda" and dtype != "float32"):
        raise UserError("--draft-extend with --drafter head runs on the CUDA-graph engine only (--backend cuda): on "
                        "the CPU a looked-up row costs a quarter of a target step, which the draft budget does not "
                        "price")
    if get("head", None) and drafter not in ("head", "auto"):
        raise UserError(f"--head names a draft head: it needs --drafter head (or auto), not --drafter {drafter}")
    lookup = get("draft_lookup", None)
    if lookup is not None:
        if not 0 <= lookup <= 3:
            raise UserError(f"--draft-lookup is the shortest n-gram matched, 0 (off) to 3, got {lookup}")
        if lookup and drafter not in ("head", "auto"):
            raise UserError(f"--draft-lookup comes before a draft head's drafts: it needs --drafter head (or auto), "
                            f"not --drafter {drafter}")
        if lookup and get("temperature", 0.0) > 0:
            raise UserError("--draft-lookup is greedy only (looked-up drafts replace the head's, whose "
                            "probabilities a sampled round's acceptance reads): drop --temperature or the lookup")
        if lookup and (extend or get("draft_tree", None)):
            raise UserError(f"--draft-lookup and {'--draft-extend' if extend else '--draft-tree'}: choose one")
    tree = parse_tree(get("draft_tree", None))
    if tree is not None:
        if drafter not in ("head", "auto"):
            raise UserError(f"--draft-tree is drafted by a draft head: it needs --drafter head (or auto), not "
                            f"--drafter {drafter}")
        if get("temperature", 0.0) > 0:
            raise UserError("--draft-tree is greedy only (sampling keeps chains): drop --temperature or the tree")
        if extend:
            raise UserError("--draft-tree and --draft-extend: a tree's alternatives come from the head, not prompt "
                            "lookup; choose one")
        if backend == "cuda" and tree[0] > 8:
            raise UserError(f"--draft-tree K,D,N on the GPU takes K <= 8 (its top-k lists), got K {tree[0]}")
        if backend == "cuda" and (get("gpu_gemv", "auto") not in ("auto", "tc") or get("fast_verify", False)):
            raise UserError("--draft-tree on the GPU verifies with the tensor-core GEMV (--gpu-gemv auto or tc)")
        if backend == "cuda" and tree[2] < tree[1]:
            raise UserError(f"--draft-tree K,D,N on the GPU drafts a chain of D with alternatives: N >= D, got {tree}")
    if backend != "cuda" and dtype == "bfloat16":
        raise UserError("--dtype bfloat16 needs --backend cuda")
    budget, adaptive_flag = get("draft_budget", "auto"), bool(get("adaptive_gamma", False))
    if adaptive_flag and budget != "auto":
        raise UserError(f"--adaptive-gamma and --draft-budget {budget}: choose one")
    try:
        sampling = SamplingConfig(temperature=get("temperature", 0.0), top_k=get("top_k", 0), top_p=get("top_p", 1.0),
                                  seed=get("seed", 0))
    except ValueError as e:
        raise UserError(str(e)) from None
    return Settings(
        target=str(get("target", d.target)), draft=str(get("draft", d.draft)), drafter=drafter,
        head=str(get("head", None)) if get("head", None) else None, backend=backend, dtype=dtype,
        weights=get("weights", d.weights), cpu_activations=cpu_activations(get("cpu_activations", "auto"), backend),
        draft_quant=get("draft_quant", d.draft_quant),
        gpu=GpuSettings(fast_verify=bool(get("fast_verify", False)), gemv=get("gpu_gemv", "auto"),
                        draft_gemv=get("gpu_draft_gemv", "auto"), draft_weights=get("gpu_draft_weights", "auto"),
                        prefill=get("gpu_prefill", "graph")),
        gamma=gamma, extend=extend, lookup=lookup, draft_vocab=draft_vocab,
        adaptive=adaptive_flag, budget=budget,
        sampling=sampling, max_new_tokens=max_new, batch=batch, tree=tree).with_budget(drafter)


def parse_tree(text: Optional[str]) -> Optional[tuple[int, int, int]]:
    """--draft-tree K,D,N as (top_k, depth, budget), each >= 1 (N at most 15: a verify of N + 1 rows stays within the
    CPU's exact row kernel, packed.MAX_ROWS, and the GPU's tensor-core GEMV); None when not given; anything else one
    line."""
    if text is None:
        return None
    parts = str(text).split(",")
    try:
        k, d, n = (int(x) for x in parts)
    except ValueError:
        raise UserError(f"--draft-tree takes K,D,N (three integers: top-k, depth, nodes), got {text!r}") from None
    if min(k, d, n) < 1 or n > 15:
        raise UserError(f"--draft-tree K,D,N needs K, D, N >= 1 and N <= 15, got {text!r}")
    return k, d, n


def cpu_activations(mode: str, backend: str) -> str:
    """--cpu-activations as the models will compute: auto is int8 on a CPU with AVX2 or AVX512-VNNI (the CPU
    default), float32 elsewhere and on the GPU; int8 asked for where it cannot run is one line."""
    from minitorch.cpu import packed as fast_packed

    if mode == "auto":
        return "int8" if backend == "cpu" and fast_packed.int8_supported() else "float32"
    if mode == "int8" and backend != "cpu":
        raise UserError("--cpu-activations int8 is for --backend cpu")
    if mode == "int8" and not fast_packed.int8_supported():
        raise UserError("--cpu-activations int8 needs a CPU with AVX2 or AVX512-VNNI")
    return mode
