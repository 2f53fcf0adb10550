"""Loading and error handling shared by the command-line programs (run_spec_decoding.py, the benchmarks, the
text writer). The flags and their settings are settings.py's; the generation is minitorch's engine.

    models = load_models(settings)            target, draft or head, tokenizer; --drafter auto decided
    engine = models.engine()                  minitorch.generation.engine.Engine: generate(prompt_ids, n)
    encode_prompt(tok, text, chat)            prompt ids
    run_cli(main)                             user errors -> one line, exit 2

A user error (bad flag value, unknown model, missing file, incompatible pair, prompt too long) is a
ValueError somewhere below; `run_cli` prints it as one line on stderr and exits with status 2. Set
MINITORCH_DEBUG=1 to see the traceback instead.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional, Sequence

from minitorch.generation import SamplingConfig
from minitorch.generation.engine import DrafterSpec, Engine, make_engine
from project.one_line_parser import EXIT_USER_ERROR
from project.settings import DEFAULT_DRAFT, Settings, UserError

EXIT_INTERRUPTED = 130
SHIPPED_HEADS = Path(__file__).resolve().parents[1] / "heads"  # the repository's draft heads, a folder each


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
    """The loaded models of a run and its resolved settings; `engine()` generates with them."""

    settings: Settings  # resolved (for_head): the drafter, gamma and --draft-extend that run
    target: Any  # a CPU model, or a CudaDecoder on the CUDA-graph path
    tokenizer: Any
    vocab_size: int  # the vocabulary target, draft and tokenizer share
    stop_ids: set[int]
    load_seconds: float
    draft: Any = None  # the draft model (--drafter model), on the target's engine
    head: Any = None  # the draft head (--drafter head): a DraftHead, or its HeadDecoder on the CUDA-graph path

    def engine(self, drafter: Optional[str] = None, gamma: Optional[int] = None,
               sampling: Optional[SamplingConfig] = None, adaptive: Optional[bool] = None) -> Engine:
        """The engine of these models with the settings' drafter, gamma and sampling, or those given ("none": the
        target alone). A drafter whose model or head is not loaded is one line."""
        s = self.settings
        kind = drafter or s.drafter
        if kind == "model" and self.draft is None:
            raise UserError("no draft model is loaded (start with --drafter model)")
        if kind == "head" and self.head is None:
            raise UserError("no draft head is loaded (start with --drafter head)")
        spec = DrafterSpec(kind=kind, model=self.draft if kind == "model" else None,
                           head=self.head if kind == "head" else None, gamma=gamma or s.gamma,
                           extend=s.extend if kind in ("model", "head") else 0,
                           propose_vocab=s.draft_vocab if kind == "model" else 0,
                           adaptive=s.adaptive if adaptive is None else adaptive,
                           tree=s.tree if kind == "head" else None,
                           lookup=(s.lookup or 0) if kind == "head" else 0,
                           lookup_min_prompt=s.lookup_min_prompt if kind == "head" else 0)
        return make_engine(self.target, spec, sampling or s.sampling, self.stop_ids, self.vocab_size)


def load_models(settings: Settings, need_draft: Optional[bool] = None, progress: bool = True) -> Models:
    """Load the target, then (the drafter decided: Settings.for_head) the draft model or the head, and check the
    pair is compatible. need_draft: load the draft model whatever drafts (a bench that runs both)."""
    if settings.graphs:
        return _load_gpu(settings, need_draft, progress)
    from minitorch.models import check_compatible, load_model

    backend = get_backend(settings.backend)
    t0 = time.perf_counter()
    dtype = "float32" if settings.dtype == "auto" else settings.dtype
    target, tok = load_model(settings.target, backend=backend, dtype=dtype, progress=progress,
                             weights=settings.weights)
    s = decide_drafter(settings, target)
    draft = None
    vocab = min(int(target.config.vocab_size), int(tok.vocab_size))
    if need_draft if need_draft is not None else s.needs_draft:
        draft, draft_tok = load_model(s.draft, backend=backend, dtype=dtype, progress=progress, weights=s.weights,
                                      requantize=draft_requantize(s, backend, progress))
        check_compatible(draft_tok, tok)
        vocab = min(vocab, int(draft.config.vocab_size), int(draft_tok.vocab_size))
    if s.cpu_activations is not None:
        set_cpu_activations(s.cpu_activations, backend, [m for m in (target, draft) if m is not None])
    head = cpu_head(s.head, target) if s.drafter == "head" else None
    if head is not None and s.cpu_activations is not None:  # the target's mode: int8 read the prompt in 24 ms, not
        set_cpu_activations(s.cpu_activations, backend, [head])  # 66 (39 tokens), and drafted in 4.7 ms, not 9.8
    return Models(settings=s, target=target, draft=draft, tokenizer=tok, vocab_size=vocab,
                  stop_ids=set(tok.stop_token_ids), load_seconds=time.perf_counter() - t0, head=head)


def decide_drafter(settings: Settings, target: Any) -> Settings:
    """Settings.for_head with the head --drafter auto would take for this target (--head, else the cache's), and
    one line on stderr when auto takes it."""
    folder = None
    if settings.drafter == "auto":
        folder = Path(settings.head) if settings.head else cached_head(target)
    s = settings.for_head(folder)
    if settings.drafter == "auto" and s.drafter == "head":
        print(f"[--drafter auto: the draft head in {folder}, gamma {s.gamma}; --drafter model drafts with "
              f"{DEFAULT_DRAFT}]", file=sys.stderr)
    return s


def set_cpu_activations(mode: str, backend: Any, models: Sequence[Any] = ()) -> None:
    """--cpu-activations: the packed kernel's activation mode for these models' weights (their own: the process's
    mode, which in-process callers and other models use, stays as it was)."""
    if getattr(backend, "cuda", False):
        return
    from minitorch.cpu import packed as fast_packed

    for model in models:  # a model or a draft head: whatever holds packed_weights()
        fast_packed.set_weight_activations(model.packed_weights(), mode)


def default_head_dir(target: Any) -> Path:
    """Where project/train_draft_head.py saves a head for this target by default: the cache's heads/<fingerprint>."""
    from minitorch.models import cache_root
    from minitorch.models.draft_head import target_fingerprint

    return cache_root() / "heads" / target_fingerprint(target)


def shipped_head(target: Any) -> Optional[Path]:
    """The repository's own head for this target: the folder of SHIPPED_HEADS whose head.json names the target's
    fingerprint, or None."""
    from minitorch.models.draft_head import target_fingerprint

    fp = target_fingerprint(target)
    for cfg in sorted(SHIPPED_HEADS.glob("*/head.json")):
        try:
            if json.loads(cfg.read_text()).get("target_fingerprint") == fp and (cfg.parent / "head.safetensors").is_file():
                return cfg.parent
        except (OSError, ValueError):
            continue
    return None


def cached_head(target: Any) -> Optional[Path]:
    """The head --drafter auto and --drafter head take when --head names none: the cache's (where
    train_draft_head.py saves yours, default_head_dir) first, else the repository's (shipped_head); None if neither."""
    folder = default_head_dir(target)
    return folder if (folder / "head.safetensors").is_file() else shipped_head(target)


def load_head_for(folder: Optional[str], target: Any) -> Any:
    """The head in `folder`, else cached_head's; missing, corrupt or another target's: one line."""
    from minitorch.models.head_io import load_head

    return load_head(folder or cached_head(target) or default_head_dir(target), target)


def cpu_head(folder: Optional[str], target: Any) -> Any:
    """The head in `folder` (None: the cache's) as the CPU engine drafts with it: next to a packed target (GGUF on the
    CPU) its packed() copy, int8 codes, each draft step one call of the CPU's one-call forward (a drafter's weights
    change how many drafts are accepted, not the output)."""
    head = load_head_for(folder, target)
    return head.packed() if target.packed_weights() else head


def draft_requantize(s: Settings, backend: Any, progress: bool = True) -> Optional[int]:
    """load_model's requantize for the draft: 4 for --draft-quant q4, or for auto when the draft is a GGUF file
    loaded packed (a CPU backend with a packed kernel, --weights not float32); else None."""
    if s.draft_quant != "auto":
        return 4 if s.draft_quant == "q4" else None
    if s.weights == "float32" or getattr(backend, "packed_linear", None) is None:
        return None
    from minitorch.models.registry import resolve

    return 4 if resolve(s.draft, progress=progress).suffix.lower() == ".gguf" else None


def _load_gpu(settings: Settings, need_draft: Optional[bool], progress: bool) -> Models:
    """The CUDA-graph path: each model read on the CPU in float32, then held on the GPU in bf16 by a CudaDecoder
    (graph-captured steps, our GEMV, sampling on the device); a head by a HeadDecoder over the target's."""
    from minitorch import FastBackend
    from minitorch.models import check_compatible, load_model

    require_gpu()
    from minitorch.cuda.decoder import CudaDecoder, int8_unsupported, weights_from_model
    from minitorch.cuda.head import HeadDecoder

    t0 = time.perf_counter()
    gpu = settings.gpu

    def int8_rows(setting: str, cfg: Any) -> bool:
        """--gpu-draft-weights for a draft model or a head: int8, or auto where its sizes allow 8-bit rows (for a
        head, one H100: GSM8K first 20 2.45x against 2.34x on bf16 rows, docs/results/gpu_int8_head/)."""
        return setting == "int8" or (setting == "auto" and not int8_unsupported(cfg))

    def decoder(name: str, gemv: str, int8: str = "bf16") -> tuple[Any, Any, Any]:
        model, tok = load_model(name, backend=FastBackend, dtype="float32", progress=progress, weights="float32")
        try:
            dec = CudaDecoder.from_model(model, gemv=gemv, int8_weights=int8_rows(int8, model.config),
                                         graph_prefill=gpu.prefill == "graph")
        except ValueError as e:  # a setting this model or GPU cannot run (8-bit rows, tensor cores): one line
            raise UserError(f"{name} on the GPU: {e}") from None
        return dec, tok, model

    target, tok, target_model = decoder(settings.target, gpu.target_mode)
    s = decide_drafter(settings, target_model)  # --drafter auto: the cache's or the repository's head for this target
    head = None
    if s.drafter == "head":
        h = load_head_for(s.head, target_model)
        try:  # the draft's (and a draft head's) bits never reach the output: its fastest kernels at each step size
            head = HeadDecoder(h.config, weights_from_model(h), target, gemv=gpu.draft_mode,
                               int8_weights=int8_rows(gpu.draft_weights, h.config))
        except ValueError as e:
            raise UserError(f"the draft head on the GPU: {e}") from None
    del target_model
    draft = None
    if need_draft if need_draft is not None else s.needs_draft:
        draft, draft_tok, _ = decoder(s.draft, gpu.draft_mode, int8=gpu.draft_weights)
        check_compatible(draft_tok, tok)
    vocab = min(target.V, draft.V if draft is not None else target.V, int(tok.vocab_size))
    return Models(settings=s, target=target, draft=draft, tokenizer=tok, vocab_size=vocab,
                  stop_ids=set(tok.stop_token_ids), load_seconds=time.perf_counter() - t0, head=head)


def encode_prompt(tok: Any, text: str, chat: bool, system: Optional[str] = None) -> list[int]:
    """Token ids of the prompt, through the model's chat template when chat is on."""
    if not text.strip():
        raise UserError("the prompt is empty")
    if chat:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": text}]
        text = tok.apply_chat_template(messages, add_generation_prompt=True)
    return list(tok.encode(text))


def with_draft(models: Models, progress: bool = True) -> Models:
    """The same models with the draft model loaded too (the interactive /draft and /drafter model commands)."""
    if models.draft is not None:
        return models
    loaded = load_models(replace(models.settings, drafter="model"), need_draft=True, progress=progress)
    return replace(models, draft=loaded.draft, vocab_size=min(models.vocab_size, loaded.vocab_size))


def fail(msg: str) -> None:
    """Print one line to stderr and exit with the user-error status."""
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)


def run_cli(main: Callable[[], Optional[int]]) -> None:
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
