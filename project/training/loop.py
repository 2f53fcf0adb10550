"""Training a draft head with MiniTorch's autodiff and Adam: batches, one step, held-out agreement, checkpoints.

One step over a batch of B sequences padded to T (B x T <= --tokens-per-step), for head positions t = 0..T-2:

    inputs   f_t (the target's feature) and embed(x_{t+1})              constants, no history
    labels   f_{t+1} and p_{t+1} = softmax(f_{t+1} @ lm_head[:N]^T)     the target's own next feature and distribution
    loss     SmoothL1(g_t, f_{t+1}) + 0.1 x soft cross-entropy(p_{t+1}, g_t @ lm_head[:N]^T), answer positions only

With --ttt-steps K > 1 (EAGLE-3's training-time test, ttt.forward_steps) the same pass also runs draft
steps 2..K, where position t reads the previous step's output g_{t-1} instead of f_t, as drafting does; each
step has step 1's labels, and the loss is sum_j 0.8^(j-1) x step j's loss (ttt_loss). K = 1 is the pass above.

then loss.backward() through the head (our backward passes: linear, RMSNorm, rope, attention, SwiGLU), a
global gradient-norm clip and Adam. A checkpoint (the head, Adam's moments, the step, the loss history) is
written every --save-every steps and at the end, so an interrupted run resumes where it stopped.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from minitorch import Adam, from_numpy, nn, no_grad
from minitorch import tensor as make_tensor
from minitorch.models.draft_head import DraftHead
from minitorch.models.head_io import save_head

from .data import Sequence_, answer_spans
from .features import FeatureStore
from .objective import head_loss, ttt_loss, ttt_step_mask
from .ttt import forward_steps

CKPT_DIR = "checkpoint"


@dataclass
class Batch:
    feats: Any        # (B, T-1, D) f_t
    emb: Any          # (B, T-1, D) embed(x_{t+1})
    next_feats: Any   # (B, T-1, D) f_{t+1}
    probs: Any        # (B, T-1, N) the target's distribution p_{t+1} over the head's ids
    mask: Any         # (B, T-1) 1 where x_{t+2} is an answer token (or the end of the sequence)
    next_argmax: np.ndarray  # (B, T-1) the target's greedy token after t+1 (top-1 agreement), -1 = not computed
    n_tokens: int


def make_batches(lengths: Sequence[int], tokens_per_step: int, rng: np.random.Generator) -> list[list[int]]:
    """Sequence indices grouped into batches of similar length (B x max length <= tokens_per_step), shuffled."""
    order = np.argsort(np.asarray(lengths) + rng.random(len(lengths)))  # by length, ties broken at random
    batches, cur, longest = [], [], 0
    for i in order:
        L = int(lengths[i])
        if cur and max(longest, L) * (len(cur) + 1) > tokens_per_step:
            batches.append(cur)
            cur, longest = [], 0
        cur.append(int(i))
        longest = max(longest, L)
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


def dense_rows(weight: Any, n: int, backend: Any) -> Any:
    """The first n rows of a vocabulary projection as a float32 Tensor (a packed weight is dequantized)."""
    rows = weight.narrow(0, 0, n)
    if hasattr(rows, "dequantize"):
        return from_numpy(np.ascontiguousarray(rows.dequantize(), dtype=np.float32), backend=backend)
    return rows if rows.dtype == "float32" else rows.to("float32")


def build_batch(idx: Sequence[int], seqs: Sequence[Sequence_], store: FeatureStore, target: Any, lm_rows: Any,
                backend: Any, with_argmax: bool = False) -> Batch:
    """The constants of one step (see the module docstring); padding positions are masked out."""
    T = max(len(seqs[i].ids) for i in idx)
    B, D = len(idx), store.dims
    f = np.zeros((B, T, D), np.float32)
    ids = np.zeros((B, T), np.int64)
    mask = np.zeros((B, T - 1), np.float32)
    for b, i in enumerate(idx):
        s = seqs[i]
        L = len(s.ids)
        f[b, :L] = store.rows(i)
        ids[b, :L] = s.ids
        for start, end in answer_spans(s):  # positions t whose label f_{t+1} predicts an answer token (or the next)
            mask[b, max(start - 2, 0):end - 1] = 1.0
    with no_grad():
        ft = from_numpy(f, backend=backend)
        feats, next_feats = ft.narrow(1, 0, T - 1).contiguous(), ft.narrow(1, 1, T - 1).contiguous()
        emb = target.model.embed_tokens(make_tensor(ids[:, 1:].tolist(), dtype="int64", backend=backend))
        emb = emb if emb.dtype == "float32" else emb.to("float32")
        probs = nn.softmax(nn.linear(next_feats, lm_rows), -1)  # (B, T-1, N)
        arg = np.full((B, T - 1), -1, np.int64)
        if with_argmax:
            full = nn.linear(next_feats, target.lm_head_weight())  # (B, T-1, V): the target's greedy choice
            vocab = min(target.config.vocab_size, full.shape[-1])
            if vocab < full.shape[-1]:
                full = full.narrow(-1, 0, vocab)
            arg = np.asarray(full.argmax(-1).to_numpy())  # on the backend: only the ids travel
    return Batch(feats, emb.contiguous(), next_feats, probs, from_numpy(mask, backend=backend), arg, int(mask.sum()))


@dataclass
class TrainState:
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    history: list[dict[str, float]] = field(default_factory=list)  # per step: loss, feat, ce, lr
    evals: list[dict[str, float]] = field(default_factory=list)    # per evaluation: step, loss, top1


def lr_at(step: int, total: int, lr: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def time_bounded_total(total: int, start_step: int, step: int, elapsed: float, budget: float,
                       measured: int = 5) -> int:
    """The step count the learning-rate schedule ends at when training has `budget` seconds: this run's pace so
    far (step - start_step steps in `elapsed` s, counted once `measured` steps are done) projected over the
    budget, at most `total`. So a --time-limit run ends its cosine decay when its time does, not part-way."""
    done = step - start_step
    if done < measured or elapsed <= 0:
        return total
    return max(step, min(total, start_step + int(done * budget / elapsed)))


def gpu_pool_line(backend: Any) -> str:
    """On a CUDA backend, what the memory pool holds (in use / cached), for the log; "" elsewhere. (On one H100 a run
    from --init ran out of memory after ~450 steps of 8,192 tokens with 83 GB held, 2026-12-06: these lines tell
    whether the use grows. CuPy's allocator itself frees its cached blocks and collects garbage before it gives up.)"""
    if not getattr(backend, "cuda", False):
        return ""
    from minitorch.cuda.runtime import get_cupy

    pool = get_cupy().get_default_memory_pool()
    return f"; GPU pool {pool.used_bytes() / 1e9:.1f} GB in use, {pool.total_bytes() / 1e9:.1f} GB held"


def is_out_of_memory(err: BaseException) -> bool:
    """Whether err is the GPU's out-of-memory error (CuPy's OutOfMemoryError, told by name: no CuPy import here)."""
    return type(err).__name__ == "OutOfMemoryError"


def clip_gradients(params: Sequence[Any], max_norm: float) -> float:
    """Scale all gradients so that their global norm is at most max_norm; returns the norm before."""
    grads = [p.value.grad for p in params if p.value is not None and p.value.grad is not None]
    norm = math.sqrt(sum(float((g * g).sum().item()) for g in grads))
    if max_norm > 0 and norm > max_norm:
        s = max_norm / (norm + 1e-6)
        for p in params:
            if p.value is not None and p.value.grad is not None:
                p.value.grad = p.value.grad * s
    return norm


def train_step(head: DraftHead, opt: Adam, batch: Batch, lm_rows: Any, ce_weight: float, clip: float,
               ttt_steps: int = 1) -> dict[str, float]:
    """Forward, backward, clip, Adam: one step. Returns the loss parts: loss (the objective), feat and ce (step
    1's), and with ttt_steps > 1 each later step's unweighted loss (loss_step2, ...)."""
    opt.zero_grad()
    later = []
    if ttt_steps == 1:
        g = head(batch.feats, batch.emb)
        logits = head.logits(g, lm_rows, lm_rows.shape[0])
        loss, feat, ce = head_loss(g, logits, batch.next_feats, batch.probs, batch.mask, ce_weight)
    else:
        gs = forward_steps(head, batch.feats, batch.emb, ttt_steps)
        logits = [head.logits(g, lm_rows, lm_rows.shape[0]) for g in gs]
        loss, parts = ttt_loss(gs, logits, batch.next_feats, batch.probs, batch.mask, ce_weight)
        (_, feat, ce), later = parts[0], parts[1:]
    loss.backward()
    norm = clip_gradients(head.parameters(), clip)
    opt.step()
    rec = {"loss": float(loss.item()), "feat": float(feat.item()), "ce": float(ce.item()), "grad_norm": norm}
    for j, (lj, _, _) in enumerate(later, 2):
        rec[f"loss_step{j}"] = float(lj.item())
    return rec


def evaluate(head: DraftHead, batches: Sequence[list[int]], seqs: Sequence[Sequence_], store: FeatureStore,
             target: Any, lm_rows: Any, ce_weight: float, steps: int = 1) -> dict[str, Any]:
    """Held-out loss and top-1 agreement: how often the head's first draft (its argmax over its ids, from the
    target's own feature) is the target's greedy token, over answer positions. With steps > 1 also per draft
    step j (ttt.forward_steps: step j reads the head's own step j-1 output, as drafting does), over the
    answer positions t >= j-1: top1_steps and loss_steps (unweighted), whose first entries are top1 and loss."""
    tot = {"loss": [0.0] * steps, "top1": [0.0] * steps, "n": [0.0] * steps}
    with no_grad():
        for idx in batches:
            b = build_batch(idx, seqs, store, target, lm_rows, head.backend, with_argmax=True)
            gs = head(b.feats, b.emb) if steps == 1 else forward_steps(head, b.feats, b.emb, steps)
            for j, g in enumerate([gs] if steps == 1 else gs, 1):
                mask = b.mask if j == 1 else ttt_step_mask(b.mask, j)
                logits = head.logits(g, lm_rows, lm_rows.shape[0])
                loss, _, _ = head_loss(g, logits, b.next_feats, b.probs, mask, ce_weight)
                pred = np.asarray(logits.argmax(-1).to_numpy())
                m = np.asarray(mask.to_numpy()) > 0
                n = float(m.sum())
                tot["loss"][j - 1] += float(loss.item()) * n
                tot["top1"][j - 1] += float((pred[m] == b.next_argmax[m]).sum())
                tot["n"][j - 1] += n
    loss = [x / max(n, 1.0) for x, n in zip(tot["loss"], tot["n"])]
    top1 = [x / max(n, 1.0) for x, n in zip(tot["top1"], tot["n"])]
    out: dict[str, Any] = {"loss": loss[0], "top1": top1[0], "tokens": int(tot["n"][0]), "n_steps": tot["n"]}
    if steps > 1:
        out.update(top1_steps=top1, loss_steps=loss)
    return out


# -- checkpoints --------------------------------------------------------------------------------

def save_checkpoint(folder: Path, head: DraftHead, opt: Adam, state: TrainState) -> None:
    """head + Adam moments + state into folder/checkpoint, replaced whole (a kill mid-write keeps the last)."""
    ck = folder / CKPT_DIR
    tmp = folder / (CKPT_DIR + ".tmp")
    if tmp.exists():
        _rmtree(tmp)
    save_head(head, tmp)
    names = {id(p): n for n, p in head.named_parameters()}
    moments = {}
    for key, store in (("m", opt.m), ("v", opt.v)):
        for pid, t in store.items():
            moments[f"{key}:{names[pid]}"] = np.asarray(t.to_numpy(), dtype=np.float32)
    np.savez(tmp / "adam.npz", **moments)
    (tmp / "state.json").write_text(json.dumps({"step": state.step, "epoch": state.epoch,
                                                "batch_in_epoch": state.batch_in_epoch, "adam_t": opt.t,
                                                "history": state.history, "evals": state.evals}))
    old = folder / (CKPT_DIR + ".old")
    if ck.exists():
        ck.replace(old)
    tmp.replace(ck)
    if old.exists():
        _rmtree(old)


def load_checkpoint(folder: Path, head: DraftHead, opt: Adam) -> TrainState:
    """Restore what save_checkpoint wrote (the head's weights in place, Adam's moments and step)."""
    from minitorch.models.safetensors_io import read_safetensors

    ck = folder / CKPT_DIR
    arrays = read_safetensors(ck / "head.safetensors")
    params = dict(head.named_parameters())
    for name, p in params.items():
        p.update(from_numpy(np.array(arrays[name], dtype=np.float32), backend=head.backend))  # writable copy
    with np.load(ck / "adam.npz") as z:
        for key in z.files:
            which, name = key.split(":", 1)
            (opt.m if which == "m" else opt.v)[id(params[name])] = from_numpy(z[key], backend=head.backend)
    s = json.loads((ck / "state.json").read_text())
    opt.t = int(s["adam_t"])
    return TrainState(step=s["step"], epoch=s["epoch"], batch_in_epoch=s["batch_in_epoch"],
                      history=s["history"], evals=s["evals"])


def _rmtree(p: Path) -> None:
    import shutil

    shutil.rmtree(p, ignore_errors=True)
