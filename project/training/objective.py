"""The draft head's training objective: EAGLE's loss (Li et al. 2024, arXiv 2401.15077) and the training-time
test's weighted sum of it over draft steps (EAGLE-3, arXiv 2503.01840; the steps come from ttt.forward_steps).

    head_loss   mean SmoothL1(g_t, f_{t+1}) over features + ce_weight x soft cross-entropy against p_{t+1}
    ttt_loss    sum over steps j of TTT_DECAY ** (j-1) x head_loss of step j, over positions t >= j-1
"""
from __future__ import annotations

import numpy as np

from minitorch import Tensor, from_numpy, nn, where

TTT_DECAY = 0.8  # step j's loss weighs TTT_DECAY ** (j - 1) (later drafts matter less: they are reached less often)


def smooth_l1(x: Tensor, y: Tensor) -> Tensor:
    """Elementwise SmoothL1 (beta 1): 0.5 d^2 where |d| < 1, else |d| - 0.5 (torch.nn.SmoothL1Loss)."""
    d = x - y
    ad = d.relu() + (-d).relu()  # |d|
    return where(ad < 1.0, d * d * 0.5, ad - 0.5)


def head_loss(g: Tensor, logits: Tensor, next_feats: Tensor, target_probs: Tensor, mask: Tensor,
              ce_weight: float = 0.1) -> tuple[Tensor, Tensor, Tensor]:
    """EAGLE's loss over the positions where mask (B, T) is 1: mean SmoothL1(g, f_{t+1}) over features plus
    ce_weight x soft cross-entropy -sum p log softmax(logits) against the target's distribution p.
    Returns (loss, feature part, cross-entropy part), each a 0-d-like (1,) tensor."""
    n = float(max(mask.to_numpy().sum(), 1.0))
    m = mask.view(*mask.shape, 1)  # (B, T, 1)
    feat = (smooth_l1(g, next_feats) * m).sum() / (n * g.shape[-1])
    ce = -((target_probs * nn.log_softmax(logits, -1)) * m).sum() / n
    return feat + ce * ce_weight, feat, ce


def ttt_step_mask(mask: Tensor, step: int) -> Tensor:
    """The loss mask (B, T) of step `step`: positions t < step-1 have no verified context for a step-th draft."""
    m = np.array(mask.to_numpy(), dtype=np.float32)
    m[:, :step - 1] = 0.0
    return from_numpy(m, backend=mask.backend)


def ttt_weights(steps: int) -> list[float]:
    """The training-time test's step weights: TTT_DECAY ** (j - 1) for steps j = 1..steps."""
    return [TTT_DECAY ** j for j in range(steps)]


def ttt_loss(gs: list[Tensor], logits: list[Tensor], next_feats: Tensor, target_probs: Tensor, mask: Tensor,
             ce_weight: float = 0.1) -> tuple[Tensor, list[tuple[Tensor, Tensor, Tensor]]]:
    """The training-time test's loss: sum over steps j of ttt_weights[j] x head_loss of step j's g and logits
    against the same labels (f_{t+1}, p_{t+1}), over mask's positions with t >= j-1 (`ttt_step_mask`).
    Returns (loss, [(loss, feature part, cross-entropy part) of each step, unweighted]); one step is head_loss."""
    parts = [head_loss(g, lg, next_feats, target_probs, mask if j == 1 else ttt_step_mask(mask, j), ce_weight)
             for j, (g, lg) in enumerate(zip(gs, logits), 1)]
    loss = parts[0][0]
    for w, (lj, _, _) in zip(ttt_weights(len(parts))[1:], parts[1:]):
        loss = loss + lj * w
    return loss, parts
