"""Where the draft head's training time goes on the GPU, with random weights of the 1.5B target's shape (nothing to
stage): the target's features (one forward a sequence, as project/training/features.py runs them) and one training
step by phase (batch, forward, backward, clip, Adam; synchronised between phases), float32 GEMMs against TF32
(minitorch/cuda/blas.py set_tf32), and the share of the step spent in cuBLAS (each GEMM timed alone).

    python tools/gpu_train_profile.py [--layers 4] [--batch 8] [--seq 1024] [--ttt 3]
    python tools/gpu_train_profile.py --cpu [--batch 4] [--seq 128]

The features' time is per layer of the target (multiply by its 28 layers); the step is the head's whole step.
--cpu: the same step on FastBackend, A/B in one run: a shared weight's gradient as one product over all rows (the
autodiff's MatMul backward now) against a batched product summed afterwards (before), alternating, medians.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "project")]


def random_target(layers: int, backend):
    from minitorch.models.config import Qwen2Config
    from minitorch.models.qwen2 import Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=layers,
                      num_attention_heads=12, num_key_value_heads=2, head_dim=128, rms_norm_eps=1e-6,
                      rope_theta=1e6, max_position_embeddings=4096, tie_word_embeddings=True)
    rng = np.random.default_rng(0)

    def rnd(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)

    H, I = cfg.hidden_size, cfg.intermediate_size
    w = {"model.embed_tokens.weight": rnd(cfg.vocab_size, H), "model.norm.weight": np.ones(H, np.float32)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for name, shape in (("self_attn.q_proj", (1536, H)), ("self_attn.k_proj", (256, H)),
                            ("self_attn.v_proj", (256, H))):
            w[p + name + ".weight"], w[p + name + ".bias"] = rnd(*shape), rnd(shape[0])
        w[p + "self_attn.o_proj.weight"] = rnd(H, 1536)
        w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"] = rnd(I, H), rnd(I, H)
        w[p + "mlp.down_proj.weight"] = rnd(H, I)
        w[p + "input_layernorm.weight"] = w[p + "post_attention_layernorm.weight"] = np.ones(H, np.float32)
    model = Qwen2ForCausalLM(cfg, backend)
    model.load_weights(w, source="random")
    return model


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--ttt", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--cpu", action="store_true", help="A/B the weight-gradient form on the CPU (no GPU needed)")
    args = ap.parse_args()
    if args.cpu:
        return cpu_ab(args)

    from minitorch.cuda.runtime import cupy_or_exit

    cp = cupy_or_exit("tools/gpu_train_profile.py")

    from minitorch import Adam, from_numpy, no_grad
    from minitorch.cuda import blas
    from minitorch.cuda.ops import make_cuda_backend
    from minitorch.models.draft_head import DraftHead, DraftHeadConfig, ttt_loss
    from training.loop import Batch, clip_gradients, dense_rows

    backend = make_cuda_backend()
    target = random_target(args.layers, backend)
    sync = cp.cuda.get_current_stream().synchronize

    # cuBLAS time: every GEMM synchronised and timed alone (inflates the step a little; gives the share)
    from collections import defaultdict

    from minitorch.cuda import runtime
    gemm_time = [0.0]
    per_kernel: dict = defaultdict(float)
    orig = {n: getattr(blas.Cublas, n) for n in ("gemm", "gemm_batched")}
    orig_launch = runtime.KernelLibrary.launch

    def timed(name):
        def f(self, *a, **k):
            if not timing[0]:
                return orig[name](self, *a, **k)
            sync()
            t = time.perf_counter()
            r = orig[name](self, *a, **k)
            sync()
            dt = time.perf_counter() - t
            gemm_time[0] += dt
            per_kernel[f"cublas {name} {a[2]}x{a[3]}x{a[4]}"] += dt
            return r
        return f

    def timed_launch(self, name, *a, **k):
        if not timing[0]:
            return orig_launch(self, name, *a, **k)
        sync()
        t = time.perf_counter()
        r = orig_launch(self, name, *a, **k)
        sync()
        per_kernel[name] += time.perf_counter() - t
        return r
    timing = [False]
    for n in orig:
        setattr(blas.Cublas, n, timed(n))
    runtime.KernelLibrary.launch = timed_launch

    rng = np.random.default_rng(1)
    ids = [int(x) for x in rng.integers(0, 151000, 360)]
    for tf32 in (False, True, None):
        timing[0] = tf32 is None
        blas.set_tf32(bool(tf32))
        with no_grad():
            target(ids, None, last_n=1, return_hidden=True)
            sync()
            t = time.perf_counter()
            for _ in range(5):
                _, h = target(ids, None, last_n=1, return_hidden=True)
                np.asarray(h.to_numpy())
            sync()
            dt = (time.perf_counter() - t) / 5
        if tf32 is None:
            print("  features, the slowest launches (5 sequences):")
            for k, v in sorted(per_kernel.items(), key=lambda kv: -kv[1])[:12]:
                print(f"    {k}: {v:.4f}")
            per_kernel.clear()
            timing[0] = False
            continue
        print(f"features tf32={tf32}: {dt * 1e3:.1f} ms per 360-token sequence with {args.layers} layers "
              f"-> {dt * 28 / args.layers * 1e3:.0f} ms at 28 layers ({360 / (dt * 28 / args.layers):.0f} tok/s)")

    from minitorch import tensor as make_tensor
    blas.set_tf32(True)
    for nb in (8, 22):  # batched features (project/training/features.py --feature-batch): nb sequences a forward
        batch_ids = make_tensor([ids] * nb, dtype="int64", backend=backend)
        with no_grad():
            target(batch_ids, None, last_n=1, return_hidden=True)
            sync()
            t = time.perf_counter()
            for _ in range(3):
                _, h = target(batch_ids, None, last_n=1, return_hidden=True)
                np.asarray(h.to_numpy())
            dt = (time.perf_counter() - t) / 3
        print(f"features tf32, {nb} sequences a forward: {dt * 1e3:.1f} ms with {args.layers} layers -> "
              f"{nb * 360 / (dt * 28 / args.layers):.0f} tok/s at 28 layers")

    cfg = DraftHeadConfig.for_target(target, 32768, 3072)  # train_draft_head.py's default MLP
    lm_rows = dense_rows(target.lm_head_weight(), 32768, backend)
    B, T, D = args.batch, args.seq, 1536
    feats = rng.standard_normal((B, T, D), dtype=np.float32)
    tok = rng.integers(0, 32768, (B, T))
    from minitorch import nn

    def batch():
        with no_grad():
            ft = from_numpy(feats.astype(np.float16).astype(np.float32), backend=backend)
            f, nf = ft.narrow(1, 0, T - 1).contiguous(), ft.narrow(1, 1, T - 1).contiguous()
            emb = target.model.embed_tokens(make_tensor(tok[:, 1:].tolist(), dtype="int64", backend=backend))
            probs = nn.softmax(nn.linear(nf, lm_rows), -1)
        return Batch(f, emb.contiguous(), nf, probs, from_numpy(np.ones((B, T - 1), np.float32), backend=backend),
                     np.full((B, T - 1), -1), B * (T - 1))

    for tf32 in (False, True):
        blas.set_tf32(tf32)
        head = DraftHead(cfg, backend, seed=0)
        opt = Adam(head.parameters(), lr=1e-4)
        for s in range(args.steps + 1):
            timing[0] = s == args.steps  # the last step measures cuBLAS alone
            gemm_time[0] = 0.0
            per_kernel.clear()
            ph = {}
            sync(); t = time.perf_counter()
            b = batch(); sync(); ph["batch"] = time.perf_counter() - t; t = time.perf_counter()
            opt.zero_grad()
            gs = head.forward_steps(b.feats, b.emb, args.ttt)
            logits = [head.logits(g, lm_rows, lm_rows.shape[0]) for g in gs]
            loss, _ = ttt_loss(gs, logits, b.next_feats, b.probs, b.mask, 0.1)
            sync(); ph["forward"] = time.perf_counter() - t; t = time.perf_counter()
            loss.backward(); sync(); ph["backward"] = time.perf_counter() - t; t = time.perf_counter()
            clip_gradients(head.parameters(), 1.0); sync(); ph["clip"] = time.perf_counter() - t
            t = time.perf_counter()
            opt.step(); sync(); ph["adam"] = time.perf_counter() - t
            tot = sum(ph.values())
            tag = "gemm-timed" if timing[0] else f"step {s}"
            print(f"train tf32={tf32} {tag}: {tot:.3f} s ({B * (T - 1) / tot:.0f} tok/s) "
                  + " ".join(f"{k} {v:.3f}" for k, v in ph.items())
                  + (f"; cuBLAS {gemm_time[0]:.3f} s, all launches {sum(per_kernel.values()):.3f} s" if timing[0] else "") + f"; loss {float(loss.item()):.4f}")
        if not tf32:
            print("  the slowest launches of the timed step (kernel: seconds):")
            for k, v in sorted(per_kernel.items(), key=lambda kv: -kv[1])[:25]:
                print(f"    {k}: {v:.4f}")
            per_kernel.clear()
        del head, opt
        cp.get_default_memory_pool().free_all_blocks()
    return 0


def cpu_ab(args) -> int:
    import minitorch.tensor_functions as tf
    from minitorch import Adam, FastBackend, from_numpy, nn, no_grad
    from minitorch.models.draft_head import DraftHead, DraftHeadConfig, ttt_loss
    from training.loop import clip_gradients, dense_rows

    batch = args.batch if args.batch != 8 else 4
    seq = args.seq if args.seq != 1024 else 128
    target = random_target(1, FastBackend)
    rng = np.random.default_rng(0)
    mk = lambda: from_numpy(rng.standard_normal((batch, seq, 1536)).astype(np.float32), backend=FastBackend)  # noqa: E731
    f, nf, emb = mk(), mk(), mk()
    lm = dense_rows(target.lm_head_weight(), 32768, FastBackend)
    with no_grad():
        probs = nn.softmax(nn.linear(nf, lm), -1)
    mask = from_numpy(np.ones((batch, seq), np.float32), backend=FastBackend)
    now = tf._matmul_weight_grad
    forms = {"one product (now)": now, "batched, summed after (before)": lambda a, b, g: a.transpose(-1, -2) @ g}
    times: dict = {k: [] for k in forms}
    for rep in range(args.steps + 1):
        for name, fn in forms.items():
            tf._matmul_weight_grad = fn
            head = DraftHead(DraftHeadConfig.for_target(target, 32768, 3072), FastBackend, seed=0)
            opt = Adam(head.parameters(), lr=1e-4)
            t0 = time.perf_counter()
            gs = head.forward_steps(f, emb, args.ttt)
            loss, _ = ttt_loss(gs, [head.logits(g, lm, 32768) for g in gs], nf, probs, mask, 0.1)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            clip_gradients(head.parameters(), 0.5)
            opt.step()
            t3 = time.perf_counter()
            if rep:  # the first round warms up
                times[name].append((t3 - t0, t2 - t1))
            print(f"{name}: step {t3 - t0:.3f} s, backward {t2 - t1:.3f} s, loss {float(loss.item()):.6f}")
    tf._matmul_weight_grad = now
    med = {k: (float(np.median([a for a, _ in v])), float(np.median([b for _, b in v]))) for k, v in times.items()}
    (n_step, n_bwd), (o_step, o_bwd) = med.values()
    print(f"medians of {args.steps}, {batch} x {seq} tokens, --ttt {args.ttt}: step {o_step:.3f} -> {n_step:.3f} s "
          f"({o_step / n_step:.2f}x), backward {o_bwd:.3f} -> {n_bwd:.3f} s ({o_bwd / n_bwd:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
