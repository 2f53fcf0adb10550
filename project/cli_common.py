"""Flags and loading shared by the command-line programs (run_spec_decoding.py and the benchmarks).

    add_model_args(parser) / add_sampling_args(parser) / add_spec_args(parser)   the common flags
    sampling_from_args(args), check_spec_args(args)                              validated settings
    load_models(args) -> Models                                                  target, draft, tokenizer
    encode_prompt(tok, text, chat)                                               prompt ids
    run_cli(main)                                                                user errors -> one line, exit 2

A user error (bad flag value, unknown model, missing file, incompatible pair, prompt too long) is a
ValueError somewhere below; `run_cli` prints it as one line on stderr and exits with status 2. Set
MINITORCH_DEBUG=1 to see the traceback instead.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Sequence

from minitorch.generation import ExtendedDrafter, ModelDrafter, NGramDrafter, SamplingConfig
from one_line_parser import EXIT_USER_ERROR, OneLineParser  # noqa: F401  (re-exported for the programs)

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
EXIT_INTERRUPTED = 130


class UserError(ValueError):
    """A mistake the user can fix; shown as one line."""


def add_model_args(p: argparse.ArgumentParser) -> None:
    """--target, --draft, --drafter, --backend, --dtype, --weights."""
    g = p.add_argument_group("models")
    g.add_argument("--target", default=DEFAULT_TARGET,
                   help=f"target model: registry name, HF model folder or GGUF file (default {DEFAULT_TARGET})")
    g.add_argument("--draft", default=DEFAULT_DRAFT,
                   help=f"draft model for --drafter model: registry name, folder or GGUF file (default {DEFAULT_DRAFT})")
    g.add_argument("--drafter", choices=("auto", "model", "ngram", "head"), default="auto",
                   help="who proposes tokens: the draft model, prompt lookup (n-gram match, no second model), or a "
                   "draft head trained for the target (project/train_draft_head.py). auto (default): the head "
                   "when --head is given or the cache holds one for this target (at gamma 4 on the CUDA-graph "
                   "path, 3 elsewhere, unless --gamma is given), else the draft model")
    g.add_argument("--head", default=None, metavar="DIR",
                   help="the draft head's folder for --drafter head (default: the cache's head for this target)")
    g.add_argument("--backend", choices=("cpu", "cuda"), default="cpu",
                   help="where the models run: cpu (numba) or cuda (our kernels; needs a GPU and CuPy)")
    g.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                   help="auto (default): float32 on the cpu; on cuda bfloat16 through the CUDA-graph decoder "
                        "(minitorch/cuda/decoder.py: sampling and acceptance on the device). float32 on cuda: the "
                        "generic op-by-op CUDA backend")
    g.add_argument("--fast-verify", action="store_true",
                   help="cuda: verify drafts with cuBLAS tensor cores (cheaper verify steps; a near-tie between two "
                        "logits may then resolve differently than in the target-alone run). Default: our GEMV, whose "
                        "verify steps reproduce the decode steps' logits bit for bit")
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
                   help="cuda: the draft's one-token steps read bf16 weights or 8-bit copies of every projection and "
                        "of the LM head, one scale a row (kernels/gemv.cu gemv1*_i8; half the bytes: 0.5B step 0.593 "
                        "vs 0.660 ms on the H200, same acceptance on GSM8K); auto (default): int8 where the draft's "
                        "shapes allow it (sizes multiples of 16). The draft only "
                        "proposes tokens, so this changes speed and acceptance, never the output")
    g.add_argument("--gpu-prefill", choices=("eager", "graph"), default="graph",
                   help="cuda: fill the prompt's cache with one captured graph a chunk of 128 tokens, the chunk padded "
                        "(default; CudaDecoder.fill_cache: one launch instead of an eager step's ~10 a layer from "
                        "Python: prefill 8.2%% -> 1.6%% of a GSM8K run's time on the H200) or with eager steps. The "
                        "chunks' row counts differ, so cuBLAS may round the prompt's cache differently and a near-tie "
                        "may resolve differently between the two (3 of 20 GSM8K target texts); within one setting "
                        "speculative output equals the target alone's")
    g.add_argument("--draft-quant", choices=("auto", "q4", "file"), default="auto",
                   help="cpu, packed GGUF draft: q4 = the draft's 6- and 8-bit-code tensors requantized to 4 bits once "
                        "(fewer bytes a draft step reads; the draft's weights change only how many drafts are "
                        "accepted, never the output); file = as the file stores them; auto (default): q4 for a "
                        "packed GGUF draft on the cpu")
    g.add_argument("--cpu-activations", choices=("auto", "float32", "int8"), default="auto",
                   help="cpu, packed weights: the activations of every product; int8: rounded per block as llama.cpp "
                        "does (AVX2 or AVX512-VNNI integer dot products; top-1 agreement with float32 0.992 on GSM8K "
                        "test's first 20 answers; a 5-row verify costs about 1.5 steps instead of 2.7, so speculative "
                        "decoding gains); float32: the exact reference (what the oracle tests check); auto (default): "
                        "int8 where the CPU has those instructions, else float32. Speculative output equals the target "
                        "alone's in the same mode")
    g.add_argument("--weights", choices=("auto", "packed", "float32"), default="auto",
                   help="packed: a GGUF's tensors kept as the file's int8 codes + block scales (same values, ~1/3 "
                        "of the memory, faster on the cpu); float32: expanded to float32; auto (default): packed "
                        "for GGUF files on the cpu, else float32")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    """--temperature, --top-k, --top-p, --seed, --max-new-tokens."""
    g = p.add_argument_group("sampling")
    g.add_argument("--max-new-tokens", type=int, default=128, help="new tokens to generate at most (default 128)")
    g.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 = greedy (default 0)")
    g.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens; 0 = off (default 0)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1]; 1 = off (default 1)")
    g.add_argument("--seed", type=int, default=0, help="random seed of the sampler (default 0)")


def add_spec_args(p: argparse.ArgumentParser) -> None:
    """--gamma, --adaptive-gamma."""
    g = p.add_argument_group("speculative decoding")
    g.add_argument("--gamma", type=int, default=None,
                   help="the draft model's tokens per verification (default 4; 3 where --draft-extend's "
                        "default adds 4 looked-up ones: the CUDA-graph path; 3 for a head --drafter auto takes)")
    g.add_argument("--adaptive-gamma", action="store_true",
                   help="raise gamma after a fully accepted draft, lower it after an early rejection")
    g.add_argument("--draft-vocab", type=int, default=0,
                   help="the draft model proposes only among the first N token ids (BPE ids run roughly by "
                        "frequency), computing that slice of its vocabulary projection; lossless; 0 = all")
    g.add_argument("--draft-extend", type=int, default=None, metavar="N",
                   help="after the draft model's gamma tokens, up to N more by prompt lookup (the n-gram "
                        "continuation of context + drafts: no draft forward, only verify rows; lossless). "
                        "Default: 4 (with --gamma 3) on the CUDA-graph path with a draft model, its "
                        "tensor-core verify and separate-kernel draft steps (GSM8K on an H200: 1.68x the target "
                        "alone vs 1.44x for gamma 4 without; docs/GPU_RESULTS.md round 11); 0 elsewhere "
                        "(on the CPU it did not pay: 1.11x vs 1.14x)")


def sampling_from_args(args: argparse.Namespace) -> SamplingConfig:
    """The validated SamplingConfig of the flags (a ValueError names the bad value)."""
    return SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)


DEFAULT_GAMMA = 4  # the draft model's tokens a round
# --drafter auto takes a head for the target where one exists. CPU: round 17's head drafted GSM8K's first 20 (256 new
# tokens, Intel Xeon VM, docs/RESULTS.md) at 1.37x (CI 1.32-1.43) over the target alone at gamma 3, the 0.5B draft at
# its default gamma 4 at 1.27x (1.24-1.30). CUDA-graph path (one H200, round 20, docs/results/2026-12-04_h200_round20):
# the head at gamma 4 2.20x on GSM8K and 2.01x on MATH-500 first 20, the 0.5B 1.60x and 1.68x in the same sitting.
HEAD_CPU_GAMMA = 3
HEAD_GPU_GAMMA = 4
GPU_DEFAULT_EXTEND = (3, 4)  # (gamma, --draft-extend) on the CUDA-graph path: 8 verify rows, the best measured


def default_draft_extend(args: argparse.Namespace) -> int:
    """--draft-extend's default: GPU_DEFAULT_EXTEND's on the CUDA-graph path with a draft model whose verify
    runs on tensor cores (not --gpu-gemv ours: there 8 rows cost 1.05x vs 1.45x), with a fixed gamma; 0
    elsewhere."""
    gpu = graph_decoders(args) and getattr(args, "drafter", "model") in ("model", "auto")
    plain = getattr(args, "gpu_gemv", "auto") != "ours" and not getattr(args, "adaptive_gamma", False)
    return GPU_DEFAULT_EXTEND[1] if gpu and plain else 0


def check_spec_args(args: argparse.Namespace) -> None:
    """Refuse bad --gamma / --max-new-tokens before anything is loaded; fill in the defaults of --gamma and
    --draft-extend (default_draft_extend), so every later reader sees the values the run uses."""
    args.gamma_given = args.gamma is not None  # resolve_drafter sets the head's gamma only when none was given
    args.extend_given = getattr(args, "draft_extend", 0) is not None  # a default extend does not ask for the model
    if getattr(args, "draft_extend", 0) is None:
        args.draft_extend = default_draft_extend(args)
        if args.gamma is None and args.draft_extend:
            args.gamma = GPU_DEFAULT_EXTEND[0]
    if args.gamma is None:
        args.gamma = DEFAULT_GAMMA
    if args.gamma < 1:
        raise UserError(f"--gamma must be >= 1, got {args.gamma}")
    if args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if getattr(args, "draft_vocab", 0) < 0:
        raise UserError(f"--draft-vocab must be >= 0, got {args.draft_vocab}")
    extend = getattr(args, "draft_extend", 0)
    if extend < 0:
        raise UserError(f"--draft-extend must be >= 0, got {extend}")
    if extend and getattr(args, "drafter", "model") not in ("model", "auto"):
        raise UserError("--draft-extend continues a draft model's tokens: it needs --drafter model")

    if args.backend != "cuda" and args.dtype == "bfloat16":
        raise UserError("--dtype bfloat16 needs --backend cuda")


def graph_decoders(args: argparse.Namespace) -> bool:
    """Whether the flags ask for the CUDA-graph decoders (--backend cuda with --dtype auto or bfloat16)."""
    return args.backend == "cuda" and getattr(args, "dtype", "auto") != "float32"


def get_backend(name: str) -> Any:
    """The TensorBackend for --backend (cuda is imported only when asked for)."""
    if name == "cpu":
        from minitorch import FastBackend

        return FastBackend
    require_gpu()
    from minitorch.cuda import make_cuda_backend

    return make_cuda_backend()


def require_gpu() -> None:
    """--backend cuda on a machine without a usable GPU / CuPy: one line for the user."""
    from minitorch.cuda.runtime import CudaUnavailableError, get_cupy

    try:
        get_cupy()
    except CudaUnavailableError as e:
        raise UserError(f"--backend cuda needs a GPU ({e}); use --backend cpu") from None


@dataclass
class Models:
    """What a program needs to generate: models, tokenizer, and the shared vocabulary."""

    target: Any
    draft: Any  # None for the n-gram drafter
    tokenizer: Any
    vocab_size: int
    stop_ids: set[int]
    load_seconds: float
    draft_vocab: int = 0  # --draft-vocab (0: the whole shared vocabulary)
    draft_extend: int = 0  # --draft-extend: prompt-lookup tokens after the model's
    head: Any = None  # --drafter head: a DraftHead (CPU engine) or its HeadDecoder (CUDA-graph path)
    on_gpu_graphs: bool = False  # target and draft are CudaDecoders (minitorch/generation/cuda.py runs them)

    def make_drafter(self, kind: str, draft_vocab: int | None = None, steps: int | None = None) -> Any:
        """A fresh drafter of the given kind ("model" or "ngram"); draft_vocab overrides --draft-vocab.
        On the CUDA-graph path the drafter of "model" is a DecoderDrafter over the draft decoder
        (minitorch/generation/cuda.py). With --draft-extend and
        `steps` (the model's tokens a round; the round's gamma is then steps + draft_extend) the model's
        drafts are continued by prompt lookup."""
        if kind == "ngram":
            return NGramDrafter()
        if kind == "head":
            if self.head is None:
                raise UserError("no draft head is loaded (start with --drafter head)")
            if self.on_gpu_graphs:  # the head's GPU decoder (minitorch/cuda/head.py) over the target decoder
                from minitorch.generation.cuda import HeadGpuDrafter

                return HeadGpuDrafter(self.head)
            from minitorch.generation.head_drafter import HeadDrafter

            return HeadDrafter(self.head, self.target)
        if self.draft is None:
            raise UserError("no draft model is loaded (started with --drafter ngram)")
        n = self.draft_vocab if draft_vocab is None else draft_vocab
        if self.on_gpu_graphs:  # its LM head computes the first n rows for the run
            from minitorch.generation.cuda import DecoderDrafter

            return DecoderDrafter(self.draft, propose_vocab=n or None,
                                  lookup_steps=steps if self.draft_extend and steps else None)
        model = ModelDrafter(self.draft, self.vocab_size, head_vocab=n or None)
        return ExtendedDrafter(model, steps) if self.draft_extend and steps else model

    def round_drafter(self, kind: str, gamma: int) -> tuple[Any, int]:
        """(drafter, the round's gamma) for `gamma` draft-model tokens a round: with --draft-extend and a model
        drafter, that drafter continues them by prompt lookup and the round's gamma counts the looked-up ones
        too (what speculative_generate takes as gamma)."""
        if kind == "model" and self.draft_extend:
            return self.make_drafter(kind, steps=gamma), gamma + self.draft_extend
        return self.make_drafter(kind), gamma

    def functions(self) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """(generate, speculative_generate) for these models: the CPU engine's, or the CUDA-graph
        path's (same arguments and results)."""
        if self.on_gpu_graphs:
            from minitorch.generation.cuda import generate_cuda, speculative_generate_cuda

            return generate_cuda, speculative_generate_cuda
        from minitorch.generation import generate, speculative_generate

        return generate, speculative_generate


def load_models(args: argparse.Namespace, need_draft: bool | None = None, progress: bool = True) -> Models:
    """Load the target (and the draft unless --drafter ngram), check the pair is compatible."""
    from minitorch.models import check_compatible, load_model

    mode = resolve_cpu_activations(args)  # None (no such flag, e.g. a bench's namespace): the process's mode
    if graph_decoders(args):
        return load_gpu_decoders(args, need_draft, progress)
    backend = get_backend(args.backend)
    if mode is not None:
        set_cpu_activations(mode, backend)  # checked before the loads: a refusal comes at once
    t0 = time.perf_counter()
    weights = getattr(args, "weights", "auto")
    dtype = "float32" if args.dtype == "auto" else args.dtype
    target, tok = load_model(args.target, backend=backend, dtype=dtype, progress=progress, weights=weights)
    resolve_drafter(args, target)
    draft = None
    vocab = min(int(target.config.vocab_size), int(tok.vocab_size))
    if need_draft if need_draft is not None else args.drafter == "model":
        draft, draft_tok = load_model(args.draft, backend=backend, dtype=dtype, progress=progress, weights=weights,
                                      requantize=draft_requantize(args, backend, weights, progress))
        check_compatible(draft_tok, tok)
        vocab = min(vocab, int(draft.config.vocab_size), int(draft_tok.vocab_size))
    if mode is not None:
        set_cpu_activations(mode, backend, [m for m in (target, draft) if m is not None])
    head = cpu_head(getattr(args, "head", None), target) if getattr(args, "drafter", "model") == "head" else None
    return Models(target=target, draft=draft, tokenizer=tok, vocab_size=vocab,
                  stop_ids=set(tok.stop_token_ids), load_seconds=time.perf_counter() - t0,
                  draft_vocab=getattr(args, "draft_vocab", 0), draft_extend=getattr(args, "draft_extend", 0),
                  head=head)


def resolve_cpu_activations(args: argparse.Namespace) -> str | None:
    """--cpu-activations as the models will compute: auto is int8 on a CPU with AVX2 or AVX512-VNNI (the CPU
    default), float32 elsewhere and on the GPU; None when the namespace has no such flag (the process's mode)."""
    mode = getattr(args, "cpu_activations", None)
    if mode == "auto":
        from minitorch.cpu import packed as fast_packed

        mode = "int8" if args.backend == "cpu" and fast_packed.int8_supported() else "float32"
        args.cpu_activations = mode  # what ran, for the summaries that record the arguments
    if mode not in (None, "float32") and args.backend != "cpu":
        raise UserError("--cpu-activations int8 is for --backend cpu")
    return mode


def set_cpu_activations(mode: str, backend: Any, models: Sequence[Any] = ()) -> None:
    """--cpu-activations: the packed kernel's activation mode for these models' weights (their own: the process's
    mode, which in-process callers and other models use, stays as it was); with no models, only the check."""
    if getattr(backend, "cuda", False):
        return
    from minitorch.cpu import packed as fast_packed

    if mode == "int8" and not fast_packed.int8_supported():
        raise UserError("--cpu-activations int8 needs a CPU with AVX2 or AVX512-VNNI")
    for model in models:
        fast_packed.set_weight_activations(model.packed_weights(), mode)


def default_head_dir(target: Any) -> Any:
    """Where project/train_draft_head.py saves a head for this target by default: the cache's heads/<fingerprint>."""
    from minitorch.models import cache_root
    from minitorch.models.draft_head import target_fingerprint

    return cache_root() / "heads" / target_fingerprint(target)


def cached_head(target: Any) -> Any:
    """The folder of the cache's head for this target (default_head_dir), or None when none is saved there."""
    folder = default_head_dir(target)
    return folder if (folder / "head.safetensors").is_file() else None


def resolve_drafter(args: argparse.Namespace, target: Any) -> None:
    """--drafter auto, the one place it is decided (load_models and load_gpu_decoders call it with the target's CPU
    model; None: no head). "head" when --head is given, or when the cache holds a head for this target (cached_head)
    and no flag of the draft model's (--draft other than the default, a --draft-extend given, --draft-vocab) was
    given; its gamma HEAD_GPU_GAMMA on the CUDA-graph path (the default --draft-extend, the draft model's, dropped)
    and HEAD_CPU_GAMMA elsewhere, unless --gamma was given. Else "model". A fresh clone has no head: the 0.5B drafts."""
    if getattr(args, "drafter", "model") != "auto":
        return
    extend = getattr(args, "draft_extend", 0) if getattr(args, "extend_given", True) else 0
    model_flags = (str(getattr(args, "draft", DEFAULT_DRAFT)) != DEFAULT_DRAFT or extend
                   or getattr(args, "draft_vocab", 0))
    folder = None if target is None or model_flags else getattr(args, "head", None) or cached_head(target)
    args.drafter = "model" if folder is None else "head"
    if folder is not None:
        args.draft_extend = 0
        if not getattr(args, "gamma_given", True):
            args.gamma = HEAD_GPU_GAMMA if graph_decoders(args) else HEAD_CPU_GAMMA
        print(f"[--drafter auto: the draft head in {folder}, gamma {args.gamma}; --drafter model drafts with "
              f"{DEFAULT_DRAFT}]", file=sys.stderr)


def cpu_head(folder: Any, target: Any) -> Any:
    """The head in `folder` (None: the cache's) as the CPU engine drafts with it: next to a packed target (GGUF on the
    CPU) its packed() copy, int8 codes, each draft step one call of the CPU's one-call forward (a drafter's weights
    change how many drafts are accepted, not the output)."""
    head = load_head_for(argparse.Namespace(head=folder), target)
    return head.packed() if target.packed_weights() else head


def load_head_for(args: argparse.Namespace, target: Any) -> Any:
    """--head DIR, else the cache's head for the target; missing, corrupt or another target's: one clear line."""
    from minitorch.models.head_io import load_head

    folder = getattr(args, "head", None) or default_head_dir(target)
    return load_head(folder, target)


def draft_requantize(args: argparse.Namespace, backend: Any, weights: str, progress: bool = True) -> int | None:
    """load_model's requantize for the draft: 4 for --draft-quant q4, or for auto when the draft is a GGUF file
    loaded packed (a CPU backend with a packed kernel, --weights not float32); else None."""
    choice = getattr(args, "draft_quant", "auto")
    if choice != "auto":
        return 4 if choice == "q4" else None
    if weights == "float32" or getattr(backend, "packed_linear", None) is None:
        return None
    from minitorch.models.registry import resolve

    return 4 if resolve(args.draft, progress=progress).suffix.lower() == ".gguf" else None


GPU_MAX_LEN = 32768  # cache positions of a CUDA-graph decoder (at most the model's own context)


def load_gpu_decoders(args: argparse.Namespace, need_draft: bool | None = None, progress: bool = True) -> Models:
    """--backend cuda: each model read on the CPU in float32, then held on the GPU in bf16 by a
    CudaDecoder (graph-captured steps, our GEMV, sampling on the device)."""
    from minitorch import FastBackend
    from minitorch.models import check_compatible, load_model

    require_gpu()
    from minitorch.cuda.decoder import CudaDecoder, int8_unsupported, weights_from_model

    t0 = time.perf_counter()
    gemv = "ours1" if getattr(args, "fast_verify", False) else getattr(args, "gpu_gemv", "auto")
    if gemv == "auto":
        from minitorch.cuda.launch import tensor_cores_supported

        gemv = "tc" if tensor_cores_supported() else "ours"

    loaded: dict[str, Any] = {}  # the CPU models the decoders were built from, while a draft head needs its target

    def decoder(name: str, kind: str, int8: str = "bf16", role: str = "draft") -> tuple[Any, Any]:
        model, tok = load_model(name, backend=FastBackend, dtype="float32", progress=progress, weights="float32")
        loaded[role] = model
        limit = int(getattr(model.config, "max_position_embeddings", 0) or GPU_MAX_LEN)
        kw = dict(max_len=min(limit, GPU_MAX_LEN), gemv=kind,
                  graph_prefill=getattr(args, "gpu_prefill", "graph") == "graph")
        w = weights_from_model(model)
        if int8 == "int8" or (int8 == "auto" and not int8_unsupported(model.config)):
            kw["int8_weights"] = True
        try:
            return CudaDecoder(model.config, w, **kw), tok
        except ValueError as e:  # a setting this model or GPU cannot run (8-bit rows, tensor cores): one line
            raise UserError(f"{name} on the GPU: {e}") from None

    target, tok = decoder(args.target, gemv, role="target")
    target_model = loaded.pop("target")
    resolve_drafter(args, target_model)  # --drafter auto: the cache's head for this target where there is one
    # the draft's (and a draft head's) bits never reach the output (the target's verify decides every token), so
    # it runs the fastest kernels at each step size whatever the target's exact mode
    dgemv = getattr(args, "gpu_draft_gemv", "auto")
    if gemv == "ours1":
        dgemv = "ours1"
    elif dgemv == "auto":
        from minitorch.cuda.launch import tensor_cores_supported

        dgemv = "ourstc" if tensor_cores_supported() else "ours"
    head = None
    if getattr(args, "drafter", "model") == "head":
        head = load_gpu_head(args, target_model, target, dgemv)
    del target_model
    draft = None
    if need_draft if need_draft is not None else args.drafter == "model":
        int8 = getattr(args, "gpu_draft_weights", "auto")
        draft, draft_tok = decoder(args.draft, dgemv, int8=int8)
        check_compatible(draft_tok, tok)
    vocab = min(target.V, draft.V if draft is not None else target.V, int(tok.vocab_size))
    return Models(target=target, draft=draft, tokenizer=tok, vocab_size=vocab, stop_ids=set(tok.stop_token_ids),
                  load_seconds=time.perf_counter() - t0, on_gpu_graphs=True,
                  draft_extend=getattr(args, "draft_extend", 0), head=head)


def load_gpu_head(args: argparse.Namespace, target_model: Any, target: Any, gemv: str) -> Any:
    """--drafter head on the CUDA-graph path: the head for the target (load_head_for: one line when missing or
    another target's) held on the GPU by a HeadDecoder over the target decoder (shared embedding and LM head)."""
    from minitorch.cuda.decoder import weights_from_model
    from minitorch.cuda.head import HeadDecoder

    head = load_head_for(args, target_model)
    try:
        return HeadDecoder(head.config, weights_from_model(head), target, gemv=gemv)
    except ValueError as e:
        raise UserError(f"the draft head on the GPU: {e}") from None


WARM_PROMPT_TOKENS = 128  # long enough for every prefill path: more than 16 rows (the packed kernel's
# BLAS rebuild) and past PARALLEL_ATTENTION_WORK (minitorch/cpu/ops.py: threaded attention) for 1.5B-class models


def warm_up(models: Models, prompt_ids: Sequence[int] | None = None, cfg: Any = None, gamma: int = 4,
            drafter: str | None = None) -> float:
    """Run each generation path once, briefly, before anything is timed: a target-alone and (when there
    is a draft) a draft-alone generation of 3 tokens and a speculative one of a few rounds, with the
    settings of the timed runs, on a WARM_PROMPT_TOKENS-token prompt (the prompt's tokens repeated or cut;
    at most what the models' context leaves). First-run costs (numba compiling each kernel variant on a
    fresh checkout, weights paged in from disk, CUDA graphs captured) are then billed to the warm-up, not
    to whichever timed generation happens to run first. Returns its seconds, which the programs print
    apart from the timings."""
    from minitorch.generation.autoregressive import context_limit

    t0 = time.perf_counter()
    generate, speculative = models.functions()
    kind = drafter or ("model" if models.draft is not None else "head" if models.head is not None else "ngram")
    spec = kind in ("ngram", "head") or models.draft is not None
    spec_drafter, total = models.round_drafter(kind, gamma) if spec else (None, gamma)  # total: looked-up too
    new = 2 * total + 2
    limits = [context_limit(m) for m in (models.target, models.draft) if m is not None]
    n = min([WARM_PROMPT_TOKENS] + [lim - new - 1 for lim in limits if lim])
    base = list(prompt_ids or []) or [3 + i % max(models.vocab_size - 3, 1) for i in range(n)]
    ids = (base * (n // len(base) + 1))[:max(n, 1)]
    for model in (models.target, models.draft):
        if model is not None:
            generate(model, ids, 3, cfg, vocab_size=models.vocab_size)
    if spec:
        speculative(models.target, spec_drafter, ids, new, cfg, gamma=total, vocab_size=models.vocab_size)
        if models.on_gpu_graphs and kind in ("model", "head"):  # the graphs of a run's last, shorter rounds too
            from minitorch.generation.cuda import capture_speculative_graphs

            capture_speculative_graphs(models.target, spec_drafter, ids, total, cfg, vocab_size=models.vocab_size)
    return time.perf_counter() - t0


def encode_prompt(tok: Any, text: str, chat: bool, system: str | None = None) -> list[int]:
    """Token ids of the prompt, through the model's chat template when chat is on."""
    if not text.strip():
        raise UserError("the prompt is empty")
    if chat:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": text}]
        text = tok.apply_chat_template(messages, add_generation_prompt=True)
    return list(tok.encode(text))


def fail(msg: str) -> None:
    """Print one line to stderr and exit with the user-error status."""
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)


def run_cli(main: Callable[[], int | None]) -> None:
    """Run main(); ValueError/OSError -> one line + exit 2, Ctrl-C -> one line + exit 130."""
    try:
        code = main()
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except (ValueError, OSError) as e:
        if os.environ.get("MINITORCH_DEBUG"):
            raise
        msg = " ".join(str(e).split()) or type(e).__name__
        fail(msg)
    sys.exit(code or 0)
