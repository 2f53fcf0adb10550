"""Where the draft head's training time goes on the GPU, with random weights of the 1.5B target's shape (nothing to
stage): the target's features (one sequence a forward and several, as project/training/features.py --feature-batch
runs them) and a training step by phase (batch, forward, backward, clip, Adam; synchronised between phases), float32
products against TF32 (minitorch/cuda/blas.py set_tf32), then one features pass and one step with every kernel launch
and cuBLAS call timed alone (LaunchTimer).

    python tools/gpu_train_profile.py [--layers 4] [--batch 8] [--seq 1024] [--ttt 3] [--steps 3]
    python tools/gpu_train_profile.py --ab [--batch 8] [--seq 1024] [--steps 3]
    python tools/gpu_train_profile.py --cpu [--batch 4] [--seq 128] [--steps 3]
    python tools/gpu_train_profile.py --features-ab [--layers 28] [--batch 16] [--seq 1024]
    python tools/gpu_train_profile.py --features-store [--batch 400]

The features run --layers layers and print their time scaled to the 1.5B's 28; the step is the head's whole step.
--ab: only the weight-gradient A/B below, on the GPU (TF32 products, as train_draft_head.py trains there).
--features-ab: the features of --batch random sequences of --seq tokens by the float32 model (TF32, 8 sequences a
forward, as train_draft_head.py --features-by model) and by the CUDA decoder's prefill (--features-by decoder,
project/training/features.py DecoderRows), tokens a second each (after a warm-up) and how far apart they are.
--features-store: where FeatureStore.extract's time goes (the sittings reached ~18k tokens/s against a bare forward's
40k): --batch sequences of mixed lengths (lognormal around 400 tokens, 32-2,048, as data/chat's conversations) in
forwards of 8,192 tokens, grouped in order (before) and by length within windows (features.py length_groups), timed
as forwards alone, with the device-to-host copy, and as the store runs them; then a forward's tokens a second by
sequence length.
--cpu: that A/B on FastBackend: a shared weight's gradient as one product over all rows (the autodiff's MatMul
backward now) against a batched product summed afterwards (before), alternating, medians.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


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


def random_batch(target, lm_rows, feats: np.ndarray, tok: np.ndarray):
    """training/loop.py's build_batch over random float16 features (B, T, D), as FeatureStore keeps them, and random
    token ids (B, T): every position is an answer position."""
    from types import SimpleNamespace

    from project.training.data import Sequence_
    from project.training.loop import build_batch

    store = SimpleNamespace(dims=feats.shape[2], rows=feats.__getitem__)
    seqs = [Sequence_(ids=[int(x) for x in row], n_prompt=0, source="random") for row in tok]
    return build_batch(range(len(seqs)), seqs, store, target, lm_rows, target.backend)


def step_phases(head, opt, b, lm_rows, ttt: int, sync) -> tuple[dict, float]:
    """training/loop.py's train_step (clip 1.0) with the phases timed apart, sync() between them:
    ({forward, backward, clip, adam: seconds}, loss)."""
    from project.training.loop import clip_gradients
    from project.training.objective import ttt_loss
    from project.training.ttt import forward_steps

    ph, t = {}, time.perf_counter()

    def lap(name):
        nonlocal t
        sync()
        ph[name], t = time.perf_counter() - t, time.perf_counter()
    opt.zero_grad()
    gs = forward_steps(head, b.feats, b.emb, ttt)
    loss, _ = ttt_loss(gs, [head.logits(g, lm_rows, lm_rows.shape[0]) for g in gs], b.next_feats, b.probs, b.mask,
                       0.1)
    lap("forward")
    loss.backward()
    lap("backward")
    clip_gradients(head.parameters(), 1.0)
    lap("clip")
    opt.step()
    lap("adam")
    return ph, float(loss.item())


class LaunchTimer:
    """While `on`: every kernel launch (KernelLibrary.launch) and cuBLAS call synchronised and timed alone, summed by
    name (the syncs inflate the total a little; the shares are the point)."""

    def __init__(self, sync) -> None:
        from collections import defaultdict

        from minitorch.cuda import blas, runtime

        self.on, self.sync, self.times = False, sync, defaultdict(float)
        for cls, name, key in ((runtime.KernelLibrary, "launch", lambda a: a[0]),
                               (blas.Cublas, "gemm", lambda a: f"cublas gemm {a[2]}x{a[3]}x{a[4]}"),
                               (blas.Cublas, "gemm_batched", lambda a: f"cublas gemm_batched {a[2]}x{a[3]}x{a[4]}")):
            setattr(cls, name, self._wrap(getattr(cls, name), key))

    def _wrap(self, fn, key):
        def timed(obj, *a, **k):
            if not self.on:
                return fn(obj, *a, **k)
            self.sync()
            t = time.perf_counter()
            r = fn(obj, *a, **k)
            self.sync()
            self.times[key(a)] += time.perf_counter() - t
            return r
        return timed

    def report(self, title: str, n: int) -> None:
        cublas = sum(v for k, v in self.times.items() if k.startswith("cublas"))
        print(f"  {title}: all launches {sum(self.times.values()):.3f} s, cuBLAS {cublas:.3f} s; the slowest:")
        for k, v in sorted(self.times.items(), key=lambda kv: -kv[1])[:n]:
            print(f"    {k}: {v:.4f}")
        self.times.clear()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4, help="the target's layers for the features (default 4)")
    ap.add_argument("--batch", type=int, default=None, help="sequences a step (default 8; 4 with --cpu)")
    ap.add_argument("--seq", type=int, default=None, help="tokens a sequence (default 1024; 128 with --cpu)")
    ap.add_argument("--ttt", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up)")
    ap.add_argument("--ab", action="store_true", help="only the weight-gradient A/B, on the GPU")
    ap.add_argument("--cpu", action="store_true", help="the weight-gradient A/B on the CPU (no GPU needed)")
    ap.add_argument("--features-ab", action="store_true", help="the features by the model against the decoder's")
    ap.add_argument("--features-store", action="store_true", help="where the feature store's time goes")
    args = ap.parse_args()
    if args.features_ab:
        return features_ab(args)
    if args.features_store:
        return features_store(args)
    args.batch = args.batch or (4 if args.cpu else 8)
    args.seq = args.seq or (128 if args.cpu else 1024)
    if args.cpu:
        from minitorch import FastBackend
        return weight_grad_ab(args, FastBackend, lambda: None)
    if args.ab:
        from minitorch.cuda import blas
        from minitorch.cuda.ops import make_cuda_backend
        from minitorch.cuda.runtime import cupy_or_exit

        cp = cupy_or_exit("tools/gpu_train_profile.py")
        blas.set_tf32(True)
        return weight_grad_ab(args, make_cuda_backend(), cp.cuda.get_current_stream().synchronize)
    return gpu_profile(args)


def features_ab(args) -> int:
    from minitorch.cuda.runtime import cupy_or_exit

    cp = cupy_or_exit("tools/gpu_train_profile.py")
    from minitorch import no_grad
    from minitorch import tensor as make_tensor
    from minitorch.cuda import blas
    from minitorch.cuda.decoder import CudaDecoder
    from minitorch.cuda.ops import make_cuda_backend
    from project.training.features import DecoderRows

    B, T = args.batch or 16, args.seq or 1024
    layers = args.layers if args.layers != 4 else 28
    backend = make_cuda_backend()
    blas.set_tf32(True)
    target = random_target(layers, backend)
    sync = cp.cuda.get_current_stream().synchronize
    rng = np.random.default_rng(2)
    seqs = [[int(x) for x in rng.integers(0, 151000, T)] for _ in range(B)]
    out = {}

    def by_model(group):
        with no_grad():
            h = target(make_tensor(group, dtype="int64", backend=backend), None, last_n=1, return_hidden=True)[1]
            return np.asarray(h.to_numpy(), np.float32)

    rows = DecoderRows(CudaDecoder.from_model(target, max_len=T + 128, max_tokens=128))
    for name, run in (("model (tf32, 8 a forward)", lambda: np.concatenate([by_model(seqs[i:i + 8])
                                                                             for i in range(0, B, 8)])),
                      ("decoder (bf16 prefill)", lambda: np.stack([rows(s) for s in seqs]))):
        run()  # warm-up (graph capture, cuBLAS plans)
        sync()
        t = time.perf_counter()
        out[name] = run()
        dt = time.perf_counter() - t
        print(f"features by the {name}: {B * T} tokens in {dt:.2f} s, {B * T / dt:.0f} tokens/s ({layers} layers)")
    a, b = out.values()
    rel = np.linalg.norm(a - b, axis=-1) / np.linalg.norm(a, axis=-1)
    print(f"relative distance a row, decoder against model: median {np.median(rel):.4f}, max {rel.max():.4f}")
    return 0


def features_store(args) -> int:
    import tempfile

    from minitorch.cuda.runtime import cupy_or_exit

    cp = cupy_or_exit("tools/gpu_train_profile.py")
    from minitorch import no_grad
    from minitorch import tensor as make_tensor
    from minitorch.cuda import blas
    from minitorch.cuda.ops import make_cuda_backend
    from project.training.data import Sequence_
    from project.training.features import WINDOW, FeatureStore, length_groups

    backend = make_cuda_backend()
    blas.set_tf32(True)
    target = random_target(args.layers if args.layers != 4 else 28, backend)
    sync = cp.cuda.get_current_stream().synchronize
    rng = np.random.default_rng(3)
    n = args.batch or 400
    lengths = np.clip(rng.lognormal(np.log(400), 0.8, n), 32, 2048).astype(int)
    seqs = [Sequence_(ids=[int(x) for x in rng.integers(0, 151000, L)], n_prompt=8, source="random") for L in lengths]
    total = int(lengths.sum())
    in_order, i = [], 0  # the grouping before length_groups: consecutive sequences
    while i < n:
        g, longest = [i], int(lengths[i])
        while g[-1] + 1 < n and max(longest, int(lengths[g[-1] + 1])) * (len(g) + 1) <= 8192:
            longest = max(longest, int(lengths[g[-1] + 1]))
            g.append(g[-1] + 1)
        in_order.append(g)
        i = g[-1] + 1
    by_length = [[s + j for j in g] for s in range(0, n, WINDOW)
                 for g in length_groups([int(x) for x in lengths[s:s + WINDOW]], 8192)]
    for name, groups in (("in order", in_order), ("by length", by_length)):
        padded = sum(len(g) * int(max(lengths[j] for j in g)) for g in groups)
        print(f"{n} sequences, {total} tokens; grouped {name}: {padded} with padding, {len(groups)} forwards")

    def forwards(groups, copy: bool) -> float:
        t = time.perf_counter()
        with no_grad():
            for g in groups:
                longest = int(max(lengths[j] for j in g))
                ids = np.zeros((len(g), longest), np.int64)
                for b, j in enumerate(g):
                    ids[b, :lengths[j]] = seqs[j].ids
                h = target(make_tensor(ids.tolist(), dtype="int64", backend=backend), None, last_n=1,
                           return_hidden=True)[1]
                if copy:
                    np.asarray(h.to_numpy(), np.float32)
        sync()
        return time.perf_counter() - t

    forwards(by_length, False)  # warm-up
    for name, groups, copy in (("in order, forwards alone", in_order, False),
                               ("by length, forwards alone", by_length, False),
                               ("by length, forwards + copy to the host", by_length, True)):
        dt = forwards(groups, copy)
        print(f"{name}: {dt:.2f} s, {total / dt:.0f} tokens/s")
    with tempfile.TemporaryDirectory() as d:
        store = FeatureStore(Path(d), seqs, 1536, "profile")
        t = time.perf_counter()
        store.extract(target, progress=False, batch_tokens=8192)
        dt = time.perf_counter() - t
        print(f"FeatureStore.extract (the trainer's path, float16 memory map): {dt:.2f} s, {total / dt:.0f} tokens/s")
    for T in (256, 512, 1024, 2048):
        x = make_tensor([[int(v) for v in rng.integers(0, 151000, T)]] * (8192 // T), dtype="int64", backend=backend)
        with no_grad():
            target(x, None, last_n=1, return_hidden=True)
            sync()
            t = time.perf_counter()
            for _ in range(3):
                target(x, None, last_n=1, return_hidden=True)
            sync()
        dt = (time.perf_counter() - t) / 3
        print(f"a forward of {8192 // T} x {T} tokens: {dt * 1e3:.0f} ms, {8192 / dt:.0f} tokens/s")
    return 0


def gpu_profile(args) -> int:
    from minitorch.cuda.runtime import cupy_or_exit

    cp = cupy_or_exit("tools/gpu_train_profile.py")

    from minitorch import Adam, no_grad
    from minitorch import tensor as make_tensor
    from minitorch.cuda import blas
    from minitorch.cuda.ops import make_cuda_backend
    from minitorch.models.draft_head import DraftHead, DraftHeadConfig
    from project.training.loop import dense_rows

    backend = make_cuda_backend()
    target = random_target(args.layers, backend)
    sync = cp.cuda.get_current_stream().synchronize
    timer = LaunchTimer(sync)
    rng = np.random.default_rng(1)
    ids = [int(x) for x in rng.integers(0, 151000, 360)]

    def features(nb: int, reps: int) -> float:
        """Seconds a forward of nb copies of the 360-token sequence (one warm-up first)."""
        x = make_tensor([ids] * nb, dtype="int64", backend=backend)
        with no_grad():
            target(x, None, last_n=1, return_hidden=True)
            sync()
            t = time.perf_counter()
            for _ in range(reps):
                np.asarray(target(x, None, last_n=1, return_hidden=True)[1].to_numpy())
            return (time.perf_counter() - t) / reps

    per28 = 28 / args.layers  # the features' figures are scaled to the 1.5B's 28 layers
    for tf32 in (False, True):
        blas.set_tf32(tf32)
        dt = features(1, 5) * per28
        print(f"features tf32={tf32}, one sequence a forward: {dt * 1e3:.0f} ms at 28 layers ({360 / dt:.0f} tok/s)")
    for nb in (8, 22):  # project/training/features.py --feature-batch: several sequences a forward
        dt = features(nb, 3) * per28
        print(f"features tf32=True, {nb} sequences a forward: {dt * 1e3:.0f} ms at 28 layers "
              f"({nb * 360 / dt:.0f} tok/s)")
    timer.on = True
    features(1, 5)
    timer.on = False
    timer.report("features, one sequence a forward, 6 forwards (the warm-up too)", 12)

    lm_rows = dense_rows(target.lm_head_weight(), 32768, backend)
    B, T = args.batch, args.seq
    feats, tok = rng.standard_normal((B, T, 1536), dtype=np.float32).astype(np.float16), rng.integers(0, 32768, (B, T))
    for tf32 in (False, True):
        blas.set_tf32(tf32)
        head = DraftHead(DraftHeadConfig.for_target(target, 32768, 3072), backend, seed=0)  # the default MLP
        opt = Adam(head.parameters(), lr=1e-4)
        for s in range(args.steps + 2):
            timer.on = s == args.steps + 1  # the last step with every launch timed alone
            sync()
            t = time.perf_counter()
            b = random_batch(target, lm_rows, feats, tok)
            sync()
            ph, loss = step_phases(head, opt, b, lm_rows, args.ttt, sync)
            ph = {"batch": time.perf_counter() - t - sum(ph.values()), **ph}
            tot = sum(ph.values())
            print(f"train tf32={tf32} {'launches timed' if timer.on else f'step {s}'}: {tot:.3f} s "
                  f"({B * (T - 1) / tot:.0f} tok/s) " + " ".join(f"{k} {v:.3f}" for k, v in ph.items())
                  + f"; loss {loss:.4f}")
        timer.on = False
        timer.report(f"train tf32={tf32}, the timed step", 25)
        del head, opt
        cp.get_default_memory_pool().free_all_blocks()
    return 0


def weight_grad_ab(args, backend, sync) -> int:
    """The head's training step with each weight-gradient form, alternating on one batch: medians of the step and
    of its backward."""
    import minitorch.tensor_functions as tf
    from minitorch import Adam
    from minitorch.models.draft_head import DraftHead, DraftHeadConfig
    from project.training.loop import dense_rows

    target = random_target(1, backend)
    rng = np.random.default_rng(0)
    lm_rows = dense_rows(target.lm_head_weight(), 32768, backend)
    b = random_batch(target, lm_rows, rng.standard_normal((args.batch, args.seq + 1, 1536)).astype(np.float16),
                     rng.integers(0, 32768, (args.batch, args.seq + 1)))
    now = tf._matmul_weight_grad
    forms = {"one product (now)": now, "batched, summed after (before)": lambda a, b, g: a.transpose(-1, -2) @ g}
    times: dict = {k: [] for k in forms}
    try:
        for rep in range(args.steps + 1):
            for name, fn in forms.items():
                tf._matmul_weight_grad = fn
                head = DraftHead(DraftHeadConfig.for_target(target, 32768, 3072), backend, seed=0)
                ph, loss = step_phases(head, Adam(head.parameters(), lr=1e-4), b, lm_rows, args.ttt, sync)
                if rep:  # the first round warms up
                    times[name].append((sum(ph.values()), ph["backward"]))
                print(f"{name}: step {sum(ph.values()):.3f} s, backward {ph['backward']:.3f} s, loss {loss:.6f}")
    finally:
        tf._matmul_weight_grad = now
    (n_step, n_bwd), (o_step, o_bwd) = (np.median(np.asarray(v), axis=0) for v in times.values())
    print(f"medians of {args.steps}, {args.batch} x {args.seq} tokens, --ttt {args.ttt}: step {o_step:.3f} -> "
          f"{n_step:.3f} s ({o_step / n_step:.2f}x), backward {o_bwd:.3f} -> {n_bwd:.3f} s ({o_bwd / n_bwd:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
