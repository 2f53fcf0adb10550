"""GPU throughput bench: greedy decode tokens/s at batch 1 on the CUDA fast path (CudaDecoder:
our kernels + cuBLAS, CUDA-graph steps), for random weights of a named real shape or a model folder.

Prints, per shape: prefill time, decode tokens/s, achieved GB/s and the share of the measured
copy-bandwidth bound; the time of a verify step over gamma+1 tokens (gamma = 1..8) relative to a
one-token decode step; optionally transformers eager / static-cache + torch.compile on the same
shapes, decoding with sampling on the device (--sampling), and speculative decoding (--spec): forced
acceptance patterns (every draft accepted / none) and the engine itself (minitorch/generation/cuda.py).

  python project/bench/throughput.py                                  # 1.5B and 7B shapes
  python project/bench/throughput.py --shape r1-distill-qwen-7b --baselines all --spec
  python project/bench/throughput.py --spec --sampling --gammas 1 2 4 8
  python project/bench/throughput.py --spec --gemv ours --gammas 2 3 4  # cost model at --alpha 0.85
  python project/bench/throughput.py --model qwen2.5-coder-1.5b-instruct --engine --max-len 32768
      (real weights: registry name, .gguf or HF folder; --engine also times the generation engine,
      the CLI's path, at the CLI's 32k-position cache)
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Sequence


from minitorch.generation.stats import expected_tokens_by_position, expected_tokens_per_round

SHAPES: Dict[str, Dict[str, Any]] = {
    "r1-distill-qwen-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                 num_attention_heads=12, num_key_value_heads=2, rope_theta=10000.0,
                                 rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=131072),
    "r1-distill-qwen-7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                               num_attention_heads=28, num_key_value_heads=4, rope_theta=10000.0,
                               rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=131072),
    # the offline pair's shapes (tied embeddings: the LM head reads the embedding matrix)
    "qwen2.5-coder-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                               num_attention_heads=12, num_key_value_heads=2, rope_theta=1000000.0,
                               rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=32768),
    "qwen2.5-coder-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                               num_attention_heads=14, num_key_value_heads=2, rope_theta=1000000.0,
                               rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=32768),
}
DEFAULT_SHAPES = ["r1-distill-qwen-1.5b", "r1-distill-qwen-7b"]
SPEC_PAIRS = {"r1": ("r1-distill-qwen-7b", "r1-distill-qwen-1.5b"),
              "coder": ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")}
CONFIG_KEYS = tuple(SHAPES["r1-distill-qwen-7b"])


def load_real(name: str) -> "tuple[Dict[str, Any], Dict[str, Any], int]":
    """(shape, weights, vocabulary limit) of a real model (registry name, HF folder or .gguf):
    float32 checkpoint-named arrays, as the CLI's CUDA path uploads them (a GGUF is dequantized,
    never the CPU's packed form), and the tokenizer's vocabulary size capped at the logits (what
    generation limits the argmax to). ValueError / OSError for a user's mistake."""
    from minitorch.cuda.decoder import weights_from_model
    from minitorch.models import load_model

    model, tok = load_model(name, dtype="float32", weights="float32")
    shape = {k: getattr(model.config, k) for k in CONFIG_KEYS}
    weights = weights_from_model(model)
    return shape, weights, min(int(model.config.vocab_size), int(tok.vocab_size))


def cfg_of(name: str) -> SimpleNamespace:
    if name not in SHAPES:
        raise SystemExit(f"bench_throughput: unknown shape {name!r}; choose from {', '.join(SHAPES)}")
    return SimpleNamespace(**SHAPES[name])


def copy_bandwidth(cp: Any, nbytes: int = 4 << 30) -> float:
    """Measured device-to-device copy bandwidth in bytes/s (bytes read + bytes written)."""
    a = cp.ones(nbytes // 4, cp.float32)
    b = cp.empty_like(a)
    for _ in range(3):
        b[...] = a
    s, e = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(10):
        s.record()
        b[...] = a
        e.record()
        e.synchronize()
        times.append(cp.cuda.get_elapsed_time(s, e) / 1e3)
    del a, b
    return 2 * nbytes / statistics.median(times)


def bytes_per_token(cfg: Any, ctx: float) -> float:
    """Bytes a decode step must read: every weight once (one embedding row), plus the KV cache."""
    H, I, V, L = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_hidden_layers
    D = H // cfg.num_attention_heads
    Hq, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    per_layer = (Hq + 2 * Hkv) * D * (H + 1) + H * Hq * D + 3 * H * I + 2 * H
    weights = L * per_layer + H + V * H + H  # layers, final norm, lm_head, one embedding row
    kv = L * 2 * Hkv * D * ctx
    return 2.0 * (weights + kv)


def time_graph(cp: Any, dec: Any, T: int, reps: int = 30) -> float:
    """Median seconds of one replay of the T-token step graph (no advance: same position each time)."""
    dec.replay(T, all_logits=True, advance=False)
    dec.stream.synchronize()
    s, e = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(5):
        s.record(dec.stream)
        for _ in range(reps):
            dec.replay(T, all_logits=True, advance=False)
        e.record(dec.stream)
        e.synchronize()
        times.append(cp.cuda.get_elapsed_time(s, e) / 1e3 / reps)
    return statistics.median(times)


def profile_step(cp: Any, dec: Any, T: int) -> Dict[str, float]:
    """GPU microseconds per kernel kind in one eager step over T tokens (events around every launch,
    with the GPU kept busy by large copies queued first so host launch time is not counted)."""
    evs: List[Any] = []
    lib, blas = dec.k, dec.blas
    big = cp.empty(1 << 29, cp.float32)
    big2 = cp.empty_like(big)

    def launch(name: str, grid: Any, block: Any, args: Any, shared_mem: int = 0, **kw: Any) -> None:
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        lib.launch(name, grid, block, args, shared_mem, **kw)
        e.record()
        nk = (2, 3) if "qkvrope" in name else (7, 8)  # where N and K sit in the argument list
        gemv = name.startswith("gemv") and not name.startswith("gemv_resnorm_rows")  # a product (N, K in its args)
        label = f"{name} N={int(args[nk[0]])} K={int(args[nk[1]])}" if gemv else name
        evs.append((label, s, e))

    def linear(x: int, w: int, y: int, M: int, N: int, K: int, *rest: Any) -> None:
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        type(blas).linear(blas, x, w, y, M, N, K, *rest)
        e.record()
        evs.append((f"cublas N={N} K={K}", s, e))

    with dec.stream:
        for _ in range(12):  # ~12 ms of queued copies: launches below are enqueued before the GPU reaches them
            big2[...] = big
        dec.k = SimpleNamespace(launch=launch)
        blas.linear = linear
        try:
            dec._step(T, True, False)
        finally:
            dec.k = lib
            del blas.linear
    dec.stream.synchronize()
    totals: Dict[str, float] = {}
    for label, s, e in evs:
        totals[label] = totals.get(label, 0.0) + cp.cuda.get_elapsed_time(s, e) * 1e3
    del big, big2
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def bench_ours(name: str, cfg: Any, args: argparse.Namespace, bw: float) -> Dict[str, Any]:
    import cupy as cp
    import numpy as np

    from minitorch.cuda.decoder import CudaDecoder, random_weights

    max_len = args.max_len or args.prompt + args.new + 16
    is_draft = bool(args.spec) and name == SPEC_PAIRS[args.spec_pair][1]
    for_this = lambda choice: choice == "on" or (choice == "draft" and is_draft)  # noqa: E731  (off | on | draft)
    t0 = time.perf_counter()
    w = random_weights(cfg, seed=0) if args.model is None else args.weights
    gemv = args.draft_gemv if is_draft and args.draft_gemv else args.gemv
    dec = CudaDecoder(cfg, w, max_len=max_len, max_tokens=max(args.prompt, 9), gemv=gemv,
                      pdl={"auto": None, "on": True, "off": False}[args.pdl], attn_kb=args.attn_kb,
                      int8_weights=for_this(args.int8))
    del w
    cp.get_default_memory_pool().free_all_blocks()
    setup = time.perf_counter() - t0
    prompt = [int(x) for x in np.random.default_rng(0).integers(0, cfg.vocab_size, args.prompt)]
    dec.prefill(prompt)
    dec.decode(4)  # captures the decode graph
    res: Dict[str, Any] = dict(shape=name, setup_s=setup, max_len=max_len, attn_kb=dec.kb)
    for sync_every, key in ((1, "sync_each"), (args.new, "sync_end")):
        t0 = time.perf_counter()
        dec.prefill(prompt)
        t1 = time.perf_counter()
        toks = dec.decode(args.new - 1, sync_every=sync_every)
        t2 = time.perf_counter()
        res["prefill_s"] = t1 - t0
        res[f"tok_s_{key}"] = (args.new - 1) / (t2 - t1)
        res["tokens_head"] = toks[:8]
    if args.engine:  # target alone through the generation engine (what the CLI and benchmarks run)
        res.update(bench_generate(dec, prompt, args, getattr(args, "vocab_limit", None) or cfg.vocab_size))
        print(f"[{name}] engine (generate_cuda, vocabulary {res['engine_vocab']}): {res['tok_s_engine']:.1f} "
              f"tokens/sec after the prompt; bench decode loop {res['tok_s_sync_each']:.1f}")
    bpt = bytes_per_token(cfg, args.prompt + args.new / 2)
    tps = res["tok_s_sync_each"]
    res.update(bytes_per_token=bpt, gb_s=bpt * tps / 1e9, bound_tok_s=bw / bpt, share_of_bound=bpt * tps / bw)
    dec.set_position(args.prompt + args.new // 2)
    base = time_graph(cp, dec, 1)
    res["step_ms"] = base * 1e3
    res["verify_ratio"] = {g: time_graph(cp, dec, g + 1) / base for g in range(1, 9)}
    if args.sampling:  # the same decode with sampling on the device (kernels/sampling.cu) instead of argmax
        greedy = res["tok_s_sync_each"]
        for label, setting in SAMPLING_SETS.items():
            dec.set_sampling(*setting, seed=0)
            dec.prefill(prompt)
            dec.decode(4)  # captures the sampled decode graph
            dec.prefill(prompt)
            t1 = time.perf_counter()
            dec.decode(args.new - 1)
            res[f"tok_s_sampled_{label}"] = (args.new - 1) / (time.perf_counter() - t1)
        dec.set_sampling()
        print(f"[{name}] sampled decode (token read back every step): " + ", ".join(
            f"{label} {res[f'tok_s_sampled_{label}']:.1f}" for label in SAMPLING_SETS) + f" tokens/sec; greedy {greedy:.1f}")
    if args.profile:
        for T in (1, 5):
            prof = profile_step(cp, dec, T)
            res[f"profile_T{T}_us"] = prof
            print(f"[{name}] profile of one eager step, T={T} (GPU us, summed per kernel; total "
                  f"{sum(prof.values()):.0f} us):")
            for label, us in prof.items():
                print(f"    {us:9.1f}  {label}")
    print(f"[{name}] setup {setup:.1f} s, prefill {args.prompt} tokens {res['prefill_s'] * 1e3:.1f} ms")
    print(f"[{name}] ours: {res['tok_s_sync_each']:.1f} tokens/sec (token read back every step), "
          f"{res['tok_s_sync_end']:.1f} tokens/sec (read back at the end)")
    print(f"[{name}] Bandwidth achieved: {res['gb_s']:.0f} GB/s = {100 * res['share_of_bound']:.0f}% of the "
          f"{bw / 1e9:.0f} GB/s copy bound ({res['bound_tok_s']:.0f} tokens/sec bound, {bpt / 1e9:.2f} GB/token)")
    print(f"[{name}] decode step (graph) {base * 1e3:.3f} ms; verify step / decode step: " +
          ", ".join(f"g={g}: {r:.2f}x" for g, r in res["verify_ratio"].items()))
    res["decoder"] = dec
    return res


SAMPLING_SETS = {"t1": (1.0, 0, 1.0), "t0.7_topp0.9": (0.7, 0, 0.9), "topk50": (1.0, 50, 1.0)}


def bench_generate(dec: Any, prompt: List[int], args: argparse.Namespace, vocab: int) -> Dict[str, Any]:
    """Greedy target-alone tokens/s through minitorch/generation/cuda.py (prefill excluded), no stop
    tokens, the logits limited to `vocab` as the CLI limits them to the tokenizer's; restores the
    decoder's whole vocabulary after."""
    from minitorch.generation.cuda import generate_cuda

    generate_cuda(dec, prompt, 8, vocab_size=vocab)  # captures the graphs of this vocabulary
    best = 0.0
    for _ in range(2):
        st = generate_cuda(dec, prompt, args.new - 1, vocab_size=vocab).stats
        best = max(best, st["new_tokens"] / (st["time_total"] - st["time_prefill"]))
    dec.limit_vocab(dec.V)
    return dict(tok_s_engine=best, engine_vocab=vocab)


def bench_engine(target: Any, draft: Any, args: argparse.Namespace) -> List[Dict[str, Any]]:
    """The speculative engine itself (minitorch/generation/cuda.py: device acceptance, one read-back a
    round) on random weights: the two models disagree, so nearly every draft is rejected and a round
    emits one token, the same work as the forced "none accepted" pattern of bench_spec."""
    import numpy as np

    from minitorch.generation import SamplingConfig
    from minitorch.generation.cuda import speculative_generate_cuda

    prompt = [int(x) for x in np.random.default_rng(0).integers(0, target.V, args.prompt)]
    out = []
    for label, cfg in (("greedy", SamplingConfig()), ("t1", SamplingConfig(temperature=1.0))):
        for gamma in args.gammas:
            speculative_generate_cuda(target, draft, prompt, 16, cfg, gamma=gamma)  # captures the graphs
            st = speculative_generate_cuda(target, draft, prompt, 128, cfg, gamma=gamma).stats
            decode_s = st["time_total"] - st["time_prefill"]
            tps = st["new_tokens"] / decode_s
            per = {k: st[f"time_{k}"] / st["rounds"] * 1e3 for k in ("draft", "verify")}
            out.append(dict(sampling=label, gamma=gamma, tok_s=tps, alpha=st["alpha"],
                            round_ms=decode_s / st["rounds"] * 1e3, draft_ms=per["draft"], verify_ms=per["verify"]))
            print(f"[spec engine] {label} gamma={gamma}: {tps:.1f} tokens/sec after the prompt, alpha "
                  f"{st['alpha']:.3f}, {decode_s / st['rounds'] * 1e3:.2f} ms a round (GPU: draft steps "
                  f"{per['draft']:.2f} ms, verify + acceptance {per['verify']:.2f} ms)")
    return out


def bench_spec(target: Any, draft: Any, args: argparse.Namespace) -> List[Dict[str, Any]]:
    """Tokens/s for forced acceptance patterns: every draft accepted (gamma+1 tokens a cycle) and
    none accepted (1 token a cycle); each cycle runs the real draft steps and the real verify step."""
    out = []
    p0 = args.prompt
    for gamma in args.gammas:
        for pattern in ("all", "none"):
            target.set_position(p0)
            draft.set_position(p0)
            tok, pos, produced, cycles = 1, p0, 0, 0
            t0 = time.perf_counter()
            while pos + gamma + 2 < target.max_len and cycles < 40:
                draft.run([tok], all_logits=False, advance=True, graph=True)
                for _ in range(gamma - 1):
                    draft.replay(1, all_logits=False, advance=True)
                draft.stream.synchronize()
                d = [int(x) for x in draft.history[pos + 1:pos + 1 + gamma].get()]
                ids = target.run([tok] + d, all_logits=True, advance=False, graph=True)
                target.stream.synchronize()
                a = [int(x) for x in ids.get()]
                n = gamma if pattern == "all" else 0
                if n == gamma:
                    draft.set_position(pos + gamma)
                    draft.run([d[-1]], all_logits=False, advance=True, graph=True)
                else:
                    draft.set_position(pos + 1)
                target.set_position(pos + n + 1)
                tok = a[n] % min(target.V, draft.V)
                pos += n + 1
                produced += n + 1
                cycles += 1
            draft.stream.synchronize()
            dt = time.perf_counter() - t0
            out.append(dict(gamma=gamma, pattern=pattern, tok_s=produced / dt, cycle_ms=dt / cycles * 1e3))
            print(f"[spec forced] gamma={gamma} accepted={pattern:4s}: {produced / dt:.1f} tokens/sec "
                  f"({dt / cycles * 1e3:.2f} ms a cycle)")
    return out


def cost_model(alpha: float, c: float, verify_ratio: Dict[int, float], gammas: List[int]) -> Dict[int, float]:
    """Predicted speedup over target-alone decoding, every cost measured in step units:
    E[tokens a round] / (gamma * c + verify(gamma + 1) / step), per gamma (1..8)."""
    return {g: expected_tokens_per_round(alpha, g) / (g * c + verify_ratio[g]) for g in sorted(set(gammas))
            if g in verify_ratio}


LOOKUP_RATES = (0.49, 0.71, 0.77, 0.77)  # round 11, GSM8K on the H200: acceptance of looked-up draft positions 1-4


def cost_model_extended(alpha: float, c: float, verify_ratio: Dict[int, float], gammas: List[int], extend: int,
                        lookup_rates: Sequence[float] = LOOKUP_RATES) -> Dict[int, float]:
    """cost_model with --draft-extend: each round's gamma model drafts (accepted at alpha each) continued by
    `extend` looked-up ones (accepted at lookup_rates, the last rate repeated), which cost no draft step, only
    verify rows: E[tokens a round] from the per-position rates / (gamma * c + verify(gamma + extend + 1) / step).
    Draft counts whose verify was not measured are left out."""
    rates = list(lookup_rates) + [lookup_rates[-1]] * max(extend - len(lookup_rates), 0)
    out = {}
    for g in sorted(set(gammas)):
        if g + extend in verify_ratio:
            out[g] = expected_tokens_by_position([alpha] * g + rates[:extend]) / (g * c + verify_ratio[g + extend])
    return out


def bench_hf(cfg: Any, args: argparse.Namespace, compiled: bool) -> float:
    """transformers Qwen2 (random bf16 weights) greedy tokens/s, eager or static cache + torch.compile."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hc = Qwen2Config(**vars(cfg))
    with torch.device("cuda"):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(hc).to(torch.bfloat16).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, args.prompt), device="cuda")
    kw = dict(max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False)
    if compiled:
        # the documented recipe: a static cache makes generate() compile the decode forward itself
        # (torch.compile, mode "reduce-overhead" = CUDA graphs); wrapping model.forward in a second
        # torch.compile on top of that overwrote CUDA-graph outputs still in use (call 4)
        model.generation_config.cache_implementation = "static"
        if args.hf_manual_compile:  # fallback: our own compile, generate's auto-compile off
            model.generation_config.disable_compile = True
            fwd = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)

            def step(*a: Any, **k: Any) -> Any:
                torch.compiler.cudagraph_mark_step_begin()  # each call is a new CUDA-graph iteration
                out = fwd(*a, **k)
                out.logits = out.logits.clone()  # generate() keeps the logits past the next replay
                return out

            model.forward = step
    warm = dict(kw, max_new_tokens=16, min_new_tokens=16) if not compiled else kw
    for _ in range(2 if compiled else 1):
        model.generate(ids, **warm)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(ids, **kw)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    n = out.shape[1] - args.prompt
    del model
    torch.cuda.empty_cache()
    return n / dt


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", action="append", choices=sorted(SHAPES), help="named real shape (repeatable); default both")
    ap.add_argument("--model", help="bench this model's real weights instead (name, HF folder or .gguf; see load_model)")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens (default 128)")
    ap.add_argument("--new", type=int, default=256, help="new tokens to generate (default 256)")
    ap.add_argument("--baselines", choices=["none", "eager", "all"], default="none",
                    help="also time transformers eager ('eager') and static cache + torch.compile ('all')")
    ap.add_argument("--spec", action="store_true", help="speculative decoding (--spec-pair: target <- draft shapes), "
                    "forced patterns, the engine, and the cost model's speedup at --alpha")
    ap.add_argument("--spec-pair", choices=sorted(SPEC_PAIRS), default="r1",
                    help="shapes for --spec: r1 = 7B <- 1.5B (default), coder = Qwen2.5-Coder 1.5B <- 0.5B (tied)")
    ap.add_argument("--alpha", type=float, default=0.85, help="acceptance rate for --spec's cost model (default 0.85)")
    ap.add_argument("--max-len", type=int, default=0,
                    help="cache positions of each decoder (default prompt + new + 16; the CLI's is 32768)")
    ap.add_argument("--attn-kb", type=int, default=None,
                    help="keys per attention split (multiple of 32; default: the decoder's choice for --max-len)")
    ap.add_argument("--engine", action="store_true",
                    help="also time target-alone greedy decoding through the generation engine (generate_cuda, "
                         "the CLI's path: logits limited to the tokenizer's vocabulary with --model)")
    ap.add_argument("--gammas", type=int, nargs="+", default=[4], help="draft lengths for --spec (default 4)")
    ap.add_argument("--extend", type=int, default=0,
                    help="--spec: also the cost model with each gamma's drafts continued by this many looked-up "
                         "ones (--draft-extend), accepted at round 11's measured GSM8K rates (default 0: off)")
    ap.add_argument("--sampling", action="store_true",
                    help="also time decoding with sampling on the device (temperature 1; 0.7 + top-p 0.9; top-k 50)")
    ap.add_argument("--gemv", choices=["auto", "ours", "ours1", "tc"], default="auto",
                    help="products of decode/verify steps: auto (default, CudaDecoder's and the CLI's target "
                         "default): tc where the GPU has tensor cores, else ours; tc: our tensor-core GEMV for steps "
                         "of <= 16 tokens; ours: our CUDA-core GEMV for them (the CLI's --gpu-gemv ours); both exact; "
                         "ours1: one-token steps ours, verify steps in cuBLAS (the CLI's --fast-verify)")
    ap.add_argument("--draft-gemv", choices=["ours", "ours1", "tc", "ourstc"], default=None,
                    help="--spec: the draft's GEMV (default: --gemv's); ourstc = one-token steps in ours, 2..16 "
                         "tokens in tc (the CLI's draft on tensor-core GPUs)")
    which, which_help = ["off", "on", "draft"], ": off (default), on (every model), draft (only --spec's draft)"
    ap.add_argument("--int8", choices=which, default="off",
                    help="one-token steps read 8-bit copies of every projection's rows and the LM head "
                         "(CudaDecoder(int8_weights=True), kernels/gemv.cu gemv1*_i8)" + which_help)
    ap.add_argument("--pdl", choices=["auto", "on", "off"], default="auto",
                    help="programmatic dependent launch (each kernel's start overlaps the previous one's tail): "
                         "auto = on for compute capability >= 9.0 (default)")
    ap.add_argument("--baselines-only", action="store_true", help="skip our decoder; time only the transformers baselines")
    ap.add_argument("--hf-manual-compile", action="store_true",
                    help="static+compile baseline: compile model.forward ourselves instead of generate()'s auto-compile")
    ap.add_argument("--profile", action="store_true", help="print GPU time per kernel of one step (T=1 and T=5)")
    ap.add_argument("--json", type=Path, help="write all numbers to this JSON file")
    return ap


def main(argv: List[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    problem = None
    if args.prompt < 1 or args.new < 2:
        problem = "--prompt must be >= 1 and --new >= 2"
    elif args.attn_kb is not None and (args.attn_kb < 32 or args.attn_kb % 32):
        problem = f"--attn-kb must be a positive multiple of 32, got {args.attn_kb}"
    elif args.max_len and args.max_len < args.prompt + args.new + 16:
        problem = f"--max-len must be at least prompt + new + 16 = {args.prompt + args.new + 16}"
    elif any(not 1 <= g <= 8 for g in args.gammas):
        problem = "--gammas must lie in 1..8"
    elif not 0 < args.alpha < 1:
        problem = "--alpha must lie in (0, 1)"
    elif args.extend < 0 or any(g + args.extend > 8 for g in args.gammas):
        problem = "--extend must be >= 0, with gamma + extend <= 8 (the verify steps measured)"
    if problem:
        print(f"bench_throughput: {problem}", file=sys.stderr)
        return 2
    from minitorch.cuda.runtime import BUILD_DIR, cuda_available, get_cupy, unavailable_reason

    if not cuda_available():
        print(f"bench_throughput: {unavailable_reason()}", file=sys.stderr)
        return 2
    shapes = args.shape or list(DEFAULT_SHAPES)
    args.weights = None
    if args.spec and args.model is not None:
        print("bench_throughput: --spec uses the named random shapes; drop --model", file=sys.stderr)
        return 2
    if args.model is not None:  # real weights: loaded on the CPU once, uploaded as bf16
        try:
            SHAPES[args.model], args.weights, args.vocab_limit = load_real(args.model)
        except (ValueError, OSError) as e:
            print(f"bench_throughput: {e}", file=sys.stderr)
            return 2
        shapes = [args.model]
    if args.spec:
        shapes = list(SPEC_PAIRS[args.spec_pair])
    cp = get_cupy()
    dev = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    bw = copy_bandwidth(cp)
    print(f"device {dev}; measured copy bandwidth {bw / 1e9:.0f} GB/s; prompt {args.prompt}, new {args.new}, "
          f"greedy, bf16, gemv={args.gemv}, pdl={args.pdl}, int8={args.int8}, "
          f"draft_gemv={args.draft_gemv or args.gemv}; "
          f"kernels from {BUILD_DIR}")
    results: Dict[str, Any] = dict(device=dev, copy_bw=bw, shapes={})
    decs = {}
    for name in ([] if args.baselines_only else shapes):
        r = bench_ours(name, cfg_of(name), args, bw)
        decs[name] = r.pop("decoder")
        results["shapes"][name] = r
        if not args.spec:
            del decs[name]
            cp.get_default_memory_pool().free_all_blocks()
    if args.spec and not args.baselines_only:
        tname, dname = SPEC_PAIRS[args.spec_pair]
        results["spec"] = bench_spec(decs[tname], decs[dname], args)
        results["spec_engine"] = bench_engine(decs[tname], decs[dname], args)
        tr, dr = results["shapes"][tname], results["shapes"][dname]
        c = dr["step_ms"] / tr["step_ms"]
        results["cost_ratio_c"] = c
        print(f"[spec] measured cost ratio c = draft step / target step = {c:.3f} ({dname} {dr['step_ms']:.3f} ms, "
              f"{tname} {tr['step_ms']:.3f} ms)")
        results["cost_model"] = cost_model(args.alpha, c, tr["verify_ratio"], args.gammas)
        for g, sp in results["cost_model"].items():
            print(f"[spec] cost model at alpha {args.alpha}: gamma={g}: E[tokens/round] "
                  f"{expected_tokens_per_round(args.alpha, g):.2f}, verify {tr['verify_ratio'][g]:.2f}x a step "
                  f"-> predicted speedup {sp:.2f}x ({args.gemv} verify)")
        if args.extend:
            rates = " ".join(f"{a:.2f}" for a in LOOKUP_RATES)
            for g, sp in cost_model_extended(args.alpha, c, tr["verify_ratio"], args.gammas, args.extend).items():
                print(f"[spec] cost model at alpha {args.alpha}, gamma={g} + {args.extend} looked up (accepted at "
                      f"{rates}, round 11's GSM8K): verify {tr['verify_ratio'][g + args.extend]:.2f}x a step "
                      f"-> predicted speedup {sp:.2f}x ({args.gemv} verify)")
            results["cost_model_extended"] = {"extend": args.extend, "lookup_rates": list(LOOKUP_RATES),
                                              "speedup": cost_model_extended(args.alpha, c, tr["verify_ratio"],
                                                                             args.gammas, args.extend)}
        decs.clear()
        cp.get_default_memory_pool().free_all_blocks()
    if args.baselines != "none":
        try:
            import torch  # noqa: F401
        except ImportError:
            print("transformers baselines skipped: torch is not importable")
        else:
            for name in shapes:
                modes = [False, True] if args.baselines == "all" else [False]
                for compiled in ([True] if args.hf_manual_compile else modes):
                    label = "static+compile" if compiled else "eager"
                    try:
                        tps = bench_hf(cfg_of(name), args, compiled)
                    except Exception as e:  # a baseline failing must not hide our numbers
                        print(f"[{name}] transformers {label}: failed ({type(e).__name__}: {str(e)[:200]})")
                        continue
                    results["shapes"].setdefault(name, {})[f"hf_{label}"] = tps
                    print(f"[{name}] transformers {label}: {tps:.1f} tokens/sec")
    print("\nshape                  ours tok/s  GB/s  %bound  verify(g=4)  hf eager  hf compile")
    nan = float("nan")
    for name, r in results["shapes"].items():
        print(f"{name:22s} {r.get('tok_s_sync_each', nan):10.1f} {r.get('gb_s', nan):5.0f} "
              f"{100 * r.get('share_of_bound', nan):6.0f}% {r.get('verify_ratio', {}).get(4, nan):10.2f}x "
              f"{r.get('hf_eager', nan):9.1f} "
              f"{r.get('hf_static+compile', float('nan')):10.1f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
