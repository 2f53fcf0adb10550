"""Batched greedy decoding on the GPU (minitorch/cuda/batch.py BatchDecoder, driven by generation/batch.py's
continuous-batching scheduler): tokens/s against the batch size B for writing answers of --new tokens, and what
bounds each point.

  python project/bench/batch_throughput.py --model qwen2.5-coder-1.5b-instruct --batches 1 8 32 64 128 256
  python project/bench/batch_throughput.py --shape qwen2.5-coder-1.5b --batches 1 64   # random weights, that shape

Each point runs --waves x B requests (GSM8K train questions under the chat template with --model, random ids with
--shape), each writing exactly --new tokens (no stop token: the steady state of a long writing run, every answer the
same length), so the scheduler admits B prompts, decodes, and refills the slots as the answers finish. Printed per B:
new tokens/s over the whole run (admissions included), the mean decode step, the decode steps' share of the time,
and the step's bounds: the weights' bytes (read once a step whatever B) plus the KV bytes the B rows read at the
mean context, against the measured copy bandwidth (the memory-bound time a step cannot beat), and the tensor-core
FLOP rate the step reaches. The last line gives the GPU memory in use at the largest B. --json writes the rows.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Dict, List

import numpy as np

from project.bench.throughput import SHAPES, cfg_of, copy_bandwidth, load_real


def prompts_for(args: argparse.Namespace, n: int, vocab: int) -> List[List[int]]:
    """n prompts: GSM8K train questions under the model's chat template (--model), else random ids."""
    if args.model:
        from minitorch.models import load_tokenizer
        from project.evaluation.data import DEFAULT_DATA_DIR, build_prompt, load_problems

        tok = load_tokenizer(args.model, progress=False)
        qs = [p.question for p in load_problems(data_file=DEFAULT_DATA_DIR / "gsm8k" / "train.jsonl.gz")]
        return [tok.encode(build_prompt(tok, qs[i % len(qs)])) for i in range(n)]
    r = np.random.default_rng(0)
    return [[int(t) for t in r.integers(1, vocab, args.prompt)] for _ in range(n)]


def bench_point(dec: Any, B: int, prompts: List[List[int]], args: argparse.Namespace, vocab: int,
                multi_tile: bool = True) -> Dict[str, Any]:
    from minitorch.generation import SamplingConfig
    from minitorch.generation.batch import BatchRequest, run_batch

    cp = dec.cp
    max_len = max(len(p) for p in prompts) + args.new
    bd = dec.batch_decoder(slots=B, max_len=max_len, vocab_size=vocab, multi_tile=multi_tile)
    timing = {"step": 0.0, "steps": 0, "admit": 0.0}
    step, admit = bd.step, bd.admit

    def timed_step() -> List[int]:
        t = time.perf_counter()
        out = step()
        timing["step"] += time.perf_counter() - t
        timing["steps"] += 1
        return out

    def timed_admit(entries: Any) -> List[int]:
        t = time.perf_counter()
        out = admit(entries)
        timing["admit"] += time.perf_counter() - t
        return out

    # warm-up: one short run captures the decode graph and loads every kernel module
    list(run_batch(bd, [BatchRequest(p, 3) for p in prompts[:B]], SamplingConfig(), stop_ids=()))
    bd.step, bd.admit = timed_step, timed_admit
    reqs = [BatchRequest(p, args.new, key=i) for i, p in enumerate(prompts)]
    t0 = time.perf_counter()
    n_tokens = sum(len(r.result.tokens) for r in run_batch(bd, reqs, SamplingConfig(), stop_ids=()))
    wall = time.perf_counter() - t0
    free, total = cp.cuda.runtime.memGetInfo()
    step_s = timing["step"] / max(1, timing["steps"])
    mean_ctx = float(np.mean([len(p) for p in prompts])) + args.new / 2
    w_bytes = sum(int(a.nbytes) for lw in dec.layers for k, a in lw.items() if k in ("qkv", "o", "gate_up", "down"))
    w_bytes += 2 * vocab * dec.H  # the LM head's rows
    kv_bytes = B * mean_ctx * dec.L * 2 * dec.Hkv * dec.D * 2
    bound_s = (w_bytes + kv_bytes) / args.bandwidth
    flops = 2 * (w_bytes / 2) * B  # two FLOPs a weight a token
    del bd
    cp.get_default_memory_pool().free_all_blocks()
    return dict(batch=B, products="gemvtcm" if multi_tile else "gemvtcb", requests=len(prompts), new_tokens=n_tokens, wall_s=wall, tokens_per_s=n_tokens / wall,
                decode_steps=timing["steps"], step_ms=1e3 * step_s, decode_share=timing["step"] / wall,
                admit_s=timing["admit"], weight_gb=w_bytes / 1e9, kv_gb_per_step=kv_bytes / 1e9,
                bound_ms=1e3 * bound_s, bound_share=bound_s / step_s if step_s else 0.0,
                tflops=flops / step_s / 1e12 if step_s else 0.0, gpu_used_gib=(total - free) / 2 ** 30)


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="real weights: registry name, .gguf or HF folder")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-coder-1.5b",
                    help="random weights of this shape when no --model (default qwen2.5-coder-1.5b)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128], help="batch sizes B")
    ap.add_argument("--new", type=int, default=512, help="new tokens an answer (default 512)")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens with random weights (default 128)")
    ap.add_argument("--waves", type=int, default=2, help="requests = waves x B (default 2)")
    ap.add_argument("--products", nargs="+", choices=["tcm", "tcb"], default=["tcm"],
                    help="the batched products: tcm (4 tiles of 16 tokens a block, the default) and / or tcb (a block a "
                         "tile); several: each B runs each, in turn (an A/B in one run)")
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args(argv)
    if min(args.batches) < 1 or args.new < 1 or args.waves < 1:
        ap.error("--batches, --new and --waves take positive integers")
    from minitorch.cuda.decoder import CudaDecoder, random_weights
    from minitorch.cuda.runtime import get_cupy

    cp = get_cupy()
    if args.model:
        shape, weights, vocab = load_real(args.model)
        cfg = type("Cfg", (), shape)()
    else:
        cfg = cfg_of(args.shape)
        weights, vocab = random_weights(cfg), cfg.vocab_size
    dec = CudaDecoder(cfg, weights, max_len=32, max_tokens=16, gemv="tc")  # the weights (its own cache is tiny)
    del weights
    args.bandwidth = copy_bandwidth(cp)
    print(f"model {args.model or args.shape}: {dec.L} layers, hidden {dec.H}; copy bandwidth "
          f"{args.bandwidth / 1e12:.2f} TB/s; answers of {args.new} tokens, {args.waves} x B requests", flush=True)
    rows = []
    for B in args.batches:
        prompts = prompts_for(args, args.waves * B, vocab)
        for kind in args.products:
            try:
                r = bench_point(dec, B, prompts, args, vocab, multi_tile=kind == "tcm")
            except ValueError as e:  # B larger than memory allows
                print(f"B={B}: {e}", flush=True)
                break
            rows.append(r)
            print(f"B={B:4d} {kind}  {r['tokens_per_s']:9.0f} tok/s  step {r['step_ms']:6.2f} ms (decode {100 * r['decode_share']:.0f}% "
                  f"of {r['wall_s']:.1f} s)  bound {r['bound_ms']:.2f} ms = weights {r['weight_gb']:.2f} GB + KV "
                  f"{r['kv_gb_per_step']:.2f} GB a step ({100 * r['bound_share']:.0f}% of the bound)  "
                  f"{r['tflops']:.0f} TFLOP/s  GPU memory {r['gpu_used_gib']:.1f} GiB", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
