"""A trained draft head (EAGLE, Li et al. 2024, arXiv 2401.15077): one decoder layer on the target's features.

At context position t the head reads the target's final hidden state f_t (after the final norm: what the
target's LM head reads) and the embedding of the next token x_{t+1}, and predicts the target's next feature:

    g_t = layer(fc([f_t ; embed(x_{t+1})]))        fc: (2D -> D), layer: one Qwen2 decoder block
    logits_t = g_t @ lm_head[:head_vocab]^T      the target's own, frozen LM head: predicts x_{t+2}

so it is trained towards g_t ~ f_{t+1} (SmoothL1) and softmax(logits_t) ~ the target's distribution at t+1
(soft cross-entropy), EAGLE's loss. When drafting, the features of positions the target has not verified yet
are the head's own outputs g. The head owns fc and the layer; the embedding and the LM head are the target's,
so a head file is small and only drafts for the target it was trained on (`target_fingerprint`).

Training-time test (EAGLE-3, Li et al. 2025, arXiv 2503.01840): `forward_steps(feats, emb, K)` also runs the head
as it drafts, on its own outputs. Step 1 is `forward`; step j >= 2 at position t reads (g^{(j-1)}_{t-1}, e_{t+1}),
the previous step's guess of f_t, and attends to step 1's keys at s <= t-j+1 (the verified context in the cache)
plus step i's key at position t-j+i for i = 2..j (the positions it drafted itself this round); every step is
labelled like step 1 (f_{t+1}, p_{t+1}), and `ttt_loss` sums the steps' head_loss, step j weighted 0.8^(j-1).

The head proposes among the first `head_vocab` token ids only (byte-level BPE ids run roughly by frequency;
FR-Spec, arXiv 2502.14856): its LM head reads that slice of the target's. Drafting stays lossless: the target
verifies every token.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from .. import nn
from ..module import Module, Parameter
from ..tensor import Tensor
from ..tensor_functions import from_numpy, where, zeros
from .config import Qwen2Config
from .errors import ModelLoadError
from .kv_cache import KVCache
from .qwen2 import DecoderLayer, StackCache, rope_tables

HEAD_FORMAT = "minitorch-spec-draft-head/1"
TTT_MAX_STEPS = 4  # training-time test: at most this many draft steps a training pass
TTT_DECAY = 0.8  # step j's loss weighs TTT_DECAY ** (j - 1) (later drafts matter less: they are reached less often)
WEIGHTS_FILE = "head.safetensors"
CONFIG_FILE = "head.json"


@dataclass
class DraftHeadConfig:
    """Shapes of the head's layer (the target's by default; a narrower MLP is allowed), its vocabulary slice
    and the target it was trained for."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    head_vocab: int
    target_fingerprint: str
    target_name: str = ""
    training: dict[str, Any] = field(default_factory=dict)  # how it was trained (command, data, loss), for users

    @classmethod
    def for_target(cls, target: Any, head_vocab: int = 32768, intermediate_size: Optional[int] = None,
                   name: str = "") -> "DraftHeadConfig":
        """A head config shaped like one layer of `target` (a Qwen2ForCausalLM)."""
        c = target.config
        if not 1 <= head_vocab <= c.vocab_size:
            raise ValueError(f"head_vocab must be in [1, {c.vocab_size}], got {head_vocab}")
        return cls(hidden_size=c.hidden_size, intermediate_size=int(intermediate_size or c.intermediate_size),
                   num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                   head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,
                   max_position_embeddings=c.max_position_embeddings, head_vocab=int(head_vocab),
                   target_fingerprint=target_fingerprint(target), target_name=name)

    def layer_config(self) -> Qwen2Config:
        return Qwen2Config(hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
                           num_hidden_layers=1, num_attention_heads=self.num_attention_heads,
                           num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
                           rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta,
                           max_position_embeddings=self.max_position_embeddings)

    def to_dict(self) -> dict[str, Any]:
        return {"format": HEAD_FORMAT, **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DraftHeadConfig":
        if d.get("format") != HEAD_FORMAT:
            raise ModelLoadError(f"not a draft head config (format {d.get('format')!r}, expected {HEAD_FORMAT!r})")
        d = {k: v for k, v in d.items() if k != "format"}
        try:
            return cls(**d)
        except TypeError as e:
            raise ModelLoadError(f"bad draft head config: {e}") from None


def _bf16_round(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest even), as uint16 bits: equal for a float32 and a bf16 load."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def target_fingerprint(target: Any) -> str:
    """16 hex digits naming a target model: its config and the values of its final and first norms (small,
    float32 in every file format, distinct between checkpoints of one architecture). Equal across the CPU and
    CUDA backends and float32 / bf16 loads; any other model gets another."""
    c = target.config
    shape = {k: getattr(c, k) for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                          "num_attention_heads", "num_key_value_heads", "head_dim", "rope_theta")}
    h = hashlib.sha256(json.dumps(shape, sort_keys=True).encode())
    for w in (target.model.norm.weight.value, target.model.layers[0].input_layernorm.weight.value):
        h.update(_bf16_round(np.asarray(w.to_numpy(), dtype=np.float32)).tobytes())
    return h.hexdigest()[:16]


def _init(backend: Any, shape: tuple[int, ...], std: float, rng: np.random.Generator) -> Parameter:
    arr = (rng.standard_normal(shape) * std).astype(np.float32) if std else np.zeros(shape, np.float32)
    return Parameter(from_numpy(arr, backend=backend), requires_grad=True)


class DraftHead(Module):
    """fc + one decoder layer (attribute names as checkpoint keys: `fc.weight`, `layer.self_attn.q_proj.weight`).

    `forward(feats, next_ids_emb)` runs whole sequences for training; `step` runs new positions over a KV cache
    for drafting. Both return the head's features g (B, T, D); `logits(g, lm_head)` projects them.
    """

    def __init__(self, config: DraftHeadConfig, backend: Any, seed: int = 0) -> None:
        super().__init__()
        self.config = config
        self.backend = backend
        cfg = config.layer_config()
        d, rng = cfg.hidden_size, np.random.default_rng(seed)
        self.fc = _FC(backend, d, rng)
        self.layer = DecoderLayer(cfg)
        std = 0.02
        for name, p in self.layer.named_parameters():
            shape = _layer_shape(cfg, name)
            if name.endswith("layernorm.weight"):
                p.update(from_numpy(np.ones(shape, np.float32), backend=backend))
            else:
                p.update(_init(backend, shape, 0.0 if name.endswith("bias") else std, rng).value)
            p.requires_grad = True
            p.value.requires_grad_(True)
        self._cos: Optional[Tensor] = None
        self._sin: Optional[Tensor] = None
        self._stacks = StackCache()  # draft_step's DecoderStack, per vocabulary rows

    def _rope(self, start: int, t: int) -> tuple[Tensor, Tensor]:
        if self._cos is None or self._cos.shape[0] < start + t:
            n = max(start + t, 2 * (self._cos.shape[0] if self._cos is not None else 128))
            cos, sin = rope_tables(self.config.head_dim, self.config.rope_theta, n)
            self._cos, self._sin = from_numpy(cos, backend=self.backend), from_numpy(sin, backend=self.backend)
        return self._cos.narrow(0, start, t), self._sin.narrow(0, start, t)  # (T, hd)

    def forward(self, feats: Tensor, emb: Tensor, cache: Optional[KVCache] = None) -> Tensor:
        """g (B, T, D) for features f_t (B, T, D) and next-token embeddings embed(x_{t+1}) (B, T, D); with a
        cache, positions continue from cache.length."""
        b, t, _ = feats.shape
        start = 0
        if cache is not None:
            cache.check_room(t)
            start = cache.length
        cos, sin = self._rope(start, t)
        x = self.fc(nn.cat([feats, emb], -1))  # (B, T, D)
        g = self.layer(x, cos, sin, cache, 0)
        if cache is not None:
            cache.advance(t)
        return g

    # -- training-time test ------------------------------------------------------------------------
    def forward_steps(self, feats: Tensor, emb: Tensor, steps: int) -> list[Tensor]:
        """The head's outputs [g^(1), ..., g^(steps)], each (B, T, D), for whole teacher-forced sequences, as
        the head computes them when drafting (EAGLE-3's training-time test; minitorch/generation/head_drafter.py):

            step 1   position t reads (f_t, e_{t+1}); causal attention over step 1's keys: `forward`, same bits
            step j   position t reads (g^(j-1)_{t-1}, e_{t+1}) (t = 0 has no g: it reads f_0 and is never scored)
                     and attends to step 1's keys/values at s <= t-j+1 and step i's at position t-j+i, i = 2..j

        Step j's output at t is the head's j-th draft after the verified context 0..t-j+1 (with the data's
        tokens standing in for the drafted ones); positions t < j-1 have no such context (`ttt_step_mask`).
        Gradients flow through the g's into the earlier steps."""
        if not 1 <= steps <= TTT_MAX_STEPS:
            raise ValueError(f"steps must be in [1, {TTT_MAX_STEPS}], got {steps}")
        b, t, _ = feats.shape
        cos, sin = self._rope(0, t)
        x = self.fc(nn.cat([feats, emb], -1))
        q, k, v = self._qkv(x, cos, sin)
        gs = [self._finish(x, nn.attention(q, k, v, self.layer.self_attn.scale, 0))]  # DecoderLayer.forward's ops
        ks, vs = [k], [v]
        for j in range(2, steps + 1):
            prev = gs[-1] if t == 1 else nn.cat([feats.narrow(1, 0, 1), gs[-1].narrow(1, 0, t - 1)], 1)
            x = self.fc(nn.cat([prev, emb], -1))
            q, k, v = self._qkv(x, cos, sin)
            ks.append(k)
            vs.append(v)
            gs.append(self._finish(x, self._ttt_attention(q, ks, vs)))
        return gs

    def _qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The layer's attention inputs for x (B, T, D): q (B, Hq, T, hd), k, v (B, Hkv, T, hd), rope applied."""
        a = self.layer.self_attn
        b, t, _ = x.shape
        h = self.layer.input_layernorm(x)
        q = a.q_proj(h).view(b, t, a.n_heads, a.head_dim).permute(0, 2, 1, 3)
        k = a.k_proj(h).view(b, t, a.n_kv_heads, a.head_dim).permute(0, 2, 1, 3)
        v = a.v_proj(h).view(b, t, a.n_kv_heads, a.head_dim).permute(0, 2, 1, 3)
        return nn.rope(q, cos, sin), nn.rope(k, cos, sin), v

    def _finish(self, x: Tensor, o: Tensor) -> Tensor:
        """The rest of the layer after attention o (B, Hq, T, hd): o_proj, residual, MLP, residual."""
        a, layer = self.layer.self_attn, self.layer
        b, t, _ = x.shape
        o = o.permute(0, 2, 1, 3).contiguous().view(b, t, a.n_heads * a.head_dim)
        h = x + a.o_proj(o)
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def _ttt_attention(self, q: Tensor, ks: list[Tensor], vs: list[Tensor]) -> Tensor:
        """Step j = len(ks)'s attention (B, Hq, T, hd), from primitives: scores against step 1's keys (masked to
        s <= t-j+1) and against each later step i's key at t-j+i (one score a row), one softmax over all of them,
        the weighted sum of the matching values. kv heads are repeated for the query heads (GQA)."""
        a = self.layer.self_attn
        j = len(ks)
        b, hq, t, hd = q.shape
        k1, v1 = _repeat_kv(ks[0], hq), _repeat_kv(vs[0], hq)
        mask = from_numpy(ttt_context_mask(t, j), backend=q.backend)  # (T, T) 1 = not visible
        scores = [((q @ k1.transpose(2, 3)) * a.scale).masked_fill(mask, -math.inf)]  # (B, Hq, T, T)
        diag_v = []
        for i in range(2, j + 1):
            d = j - i  # row t reads step i's key at position t - d
            ki, vi = _repeat_kv(_shift_rows(ks[i - 1], d), hq), _repeat_kv(_shift_rows(vs[i - 1], d), hq)
            s = (q * ki).sum(-1, keepdim=True) * a.scale  # (B, Hq, T, 1)
            if d:
                s = s.masked_fill(from_numpy(ttt_diagonal_mask(t, d), backend=q.backend), -math.inf)
            scores.append(s)
            diag_v.append(vi)
        p = nn.softmax(nn.cat(scores, -1), -1)  # (B, Hq, T, T + j - 1); the row max is subtracted inside
        o = p.narrow(3, 0, t) @ v1
        for n, vi in enumerate(diag_v):
            o = o + p.narrow(3, t + n, 1) * vi
        return o

    # -- drafting --------------------------------------------------------------------------------
    def packed(self, block: int = 32) -> "DraftHead":
        """A copy of this head for drafting on a backend with a packed kernel (the CPU): fc and the layer's
        projections as int8 codes with one float32 scale per block of `block` inputs (PackedWeight.quantize,
        Q8_0's recipe: 0.29 of the float32 bytes), q/k/v and gate/up joined, so draft_step runs the
        backend's one-call forward over them. Its drafts may differ from the float32 head's where two tokens are
        nearly tied; the output never does (the target verifies every draft)."""
        from ..packed import PackedWeight
        from .qwen2 import join_layer_projections

        if getattr(self.backend, "packed_linear", None) is None:
            raise ValueError(f"{getattr(self.backend, 'name', self.backend)} has no packed kernel")
        head = DraftHead(self.config, self.backend)
        for (_, src), (_, dst) in zip(self.named_parameters(), head.named_parameters()):
            v = src.value
            dst.requires_grad = False
            if v.dims == 2 and v.shape[1] % block == 0:
                dst.update(PackedWeight.quantize(v.to_numpy(), block))
            else:  # norms and biases: float32 copies
                dst.update(from_numpy(np.array(v.to_numpy(), dtype=np.float32), backend=self.backend))
        join_layer_projections(head.layer)
        return head

    def draft_step(self, feats: Tensor, emb: Tensor, cache: KVCache, lm_head: Any,
                   rows: int) -> tuple[Tensor, Tensor]:
        """One drafting step over new positions (B = 1): (g of the last position (1, 1, D), its logits over the
        first `rows` ids (1, 1, rows)), as forward + logits compute them. On a backend with a one-call forward
        (the CPU's decoder_forward) and packed weights (packed()), one call after fc: the same kernels in the
        same order as forward + logits, so the same bits (tests/test_draft_head.py)."""
        from ..autodiff import is_grad_enabled

        fwd = getattr(self.backend, "decoder_forward", None)
        if fwd is None or is_grad_enabled() or feats.shape[0] != 1:
            return self._step_by_ops(feats, emb, cache, lm_head, rows)
        t = feats.shape[1]
        cache.check_room(t)
        self._rope(cache.length, t)  # the tables cover the new positions (before the stack reads them)
        stack = self._stack(lm_head, rows)
        if not self.backend.decoder_supports(stack):
            return self._step_by_ops(feats, emb, cache, lm_head, rows)
        x = self.fc(nn.cat([feats, emb], -1))  # (1, T, D): forward's first op
        logits, hidden = fwd(stack, x0=x.to_numpy()[0], cache=cache, last_n=1, return_hidden=True)
        return (from_numpy(np.ascontiguousarray(hidden[t - 1:])[None], backend=self.backend),
                from_numpy(logits[None], backend=self.backend))

    def _step_by_ops(self, feats: Tensor, emb: Tensor, cache: KVCache, lm_head: Any,
                     rows: int) -> tuple[Tensor, Tensor]:
        g = self(feats, emb, cache)
        last = g.narrow(1, g.shape[1] - 1, 1)
        return last, self.logits(last, lm_head, rows)

    def _stack(self, lm_head: Any, rows: int) -> Any:
        """The layer and lm_head's first `rows` rows as the one-call forward's DecoderStack: no embedding (the
        input is fc's output) and no final norm (g is the layer's output); kept while its weights are these."""
        from ..tensor_ops import DecoderStack
        from .qwen2 import layer_weights

        layers = (layer_weights(self.layer),)
        c = self.config
        return self._stacks.get(
            rows, (layers, lm_head, getattr(lm_head, "activations", None), self._cos, self._sin),
            lambda: DecoderStack(None, layers, None, lm_head.narrow(0, 0, rows), float(c.rms_norm_eps),
                                 c.num_attention_heads, c.num_key_value_heads, c.head_dim, self._cos, self._sin))

    def new_cache(self, max_len: int) -> KVCache:
        c = self.config
        return KVCache(1, c.num_key_value_heads, c.head_dim, max_len, self.backend)

    def logits(self, g: Tensor, lm_head: Any, rows: Optional[int] = None) -> Tensor:
        """g @ lm_head[:rows]^T (B, T, rows): the target's frozen vocabulary projection, first rows ids."""
        rows = self.config.head_vocab if rows is None else rows
        return nn.linear(g, lm_head.narrow(0, 0, rows))

    # -- files ---------------------------------------------------------------------------------
    def save(self, folder: Union[str, Path], dtype: str = "float32") -> Path:
        """head.safetensors (float32, or float16: half the file, for drafting; training checkpoints keep float32)
        + head.json in `folder`, each written whole or not at all."""
        from safetensors.numpy import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        if dtype not in ("float32", "float16"):
            raise ValueError(f"dtype must be float32 or float16, got {dtype!r}")
        arrays = {name: np.ascontiguousarray(p.value.to_numpy(), dtype=dtype) for name, p in self.named_parameters()}
        tmp = folder / (WEIGHTS_FILE + ".tmp")
        save_file(arrays, str(tmp), metadata={"format": HEAD_FORMAT})
        tmp.replace(folder / WEIGHTS_FILE)
        tmpc = folder / (CONFIG_FILE + ".tmp")
        tmpc.write_text(json.dumps(self.config.to_dict(), indent=1) + "\n")
        tmpc.replace(folder / CONFIG_FILE)
        return folder


def ttt_context_mask(t: int, step: int) -> np.ndarray:
    """(T, T) float32, 1 where step `step`'s query at position q may NOT read step 1's key at s (s > q-step+1):
    the verified context of its draft ends step-1 positions before it."""
    q, s = np.arange(t)[:, None], np.arange(t)[None, :]
    return (s > q - step + 1).astype(np.float32)


def ttt_diagonal_mask(t: int, shift: int) -> np.ndarray:
    """(T, 1) float32, 1 at rows q < shift: no key at position q - shift."""
    return (np.arange(t) < shift).astype(np.float32)[:, None]


def ttt_step_mask(mask: Tensor, step: int) -> Tensor:
    """The loss mask (B, T) of step `step`: positions t < step-1 have no verified context for a step-th draft."""
    m = np.array(mask.to_numpy(), dtype=np.float32)
    m[:, :step - 1] = 0.0
    return from_numpy(m, backend=mask.backend)


def _shift_rows(z: Tensor, d: int) -> Tensor:
    """z (B, H, T, hd) moved d positions later: row t holds z's row t-d, rows t < d are zeros."""
    if d == 0:
        return z
    b, h, t, hd = z.shape
    pad = zeros((b, h, min(d, t), hd), backend=z.backend)
    return pad if d >= t else nn.cat([pad, z.narrow(2, 0, t - d)], 2)


def _repeat_kv(z: Tensor, hq: int) -> Tensor:
    """(B, Hkv, T, hd) -> (B, Hq, T, hd): query head h reads kv head h // (Hq / Hkv), as nn.attention does."""
    b, hkv, t, hd = z.shape
    if hkv == hq:
        return z
    return z.unsqueeze(2).expand(b, hkv, hq // hkv, t, hd).reshape(b, hq, t, hd)


class _FC(Module):
    """fc: (2D -> D) with bias, initialised so that it starts near the identity on the feature half (the
    head then starts from 'the next feature is like this one', an easy point to learn from)."""

    def __init__(self, backend: Any, d: int, rng: np.random.Generator) -> None:
        super().__init__()
        w = (rng.standard_normal((d, 2 * d)) * (0.5 / math.sqrt(2 * d))).astype(np.float32)
        self.weight = Parameter(from_numpy(w, backend=backend), requires_grad=True)
        self.bias = Parameter(from_numpy(np.zeros(d, np.float32), backend=backend), requires_grad=True)

    def forward(self, x: Tensor) -> Tensor:
        return nn.linear(x, self.weight.value, self.bias.value)


def _layer_shape(cfg: Qwen2Config, name: str) -> tuple[int, ...]:
    d, hd, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    table = {"q_proj.weight": (q, d), "q_proj.bias": (q,), "k_proj.weight": (kv, d), "k_proj.bias": (kv,),
             "v_proj.weight": (kv, d), "v_proj.bias": (kv,), "o_proj.weight": (d, q),
             "gate_proj.weight": (i, d), "up_proj.weight": (i, d), "down_proj.weight": (d, i)}
    leaf = ".".join(name.split(".")[-2:])
    return table.get(leaf, (d,))


def load_head(folder: Union[str, Path], target: Any, backend: Any = None) -> DraftHead:
    """A saved head for `target`; a missing, corrupt or other target's head is a ModelLoadError naming it."""
    from .safetensors_io import read_safetensors

    folder = Path(folder)
    if folder.is_file() and folder.name in (WEIGHTS_FILE, CONFIG_FILE):
        folder = folder.parent
    cfg_path, w_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    if not cfg_path.is_file() or not w_path.is_file():
        raise ModelLoadError(f"no draft head in {folder} (needs {CONFIG_FILE} and {WEIGHTS_FILE}); "
                             "train one with project/train_draft_head.py")
    try:
        cfg = DraftHeadConfig.from_dict(json.loads(cfg_path.read_text()))
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"malformed JSON in {cfg_path}: {e}") from None
    fp = target_fingerprint(target)
    if cfg.target_fingerprint != fp:
        raise ModelLoadError(f"the draft head in {folder} was trained for another target (fingerprint "
                             f"{cfg.target_fingerprint}{' = ' + cfg.target_name if cfg.target_name else ''}), "
                             f"not this one ({fp}); train one for it with project/train_draft_head.py")
    backend = backend or target.backend
    head = DraftHead(cfg, backend)
    arrays = read_safetensors(w_path)
    for name, p in head.named_parameters():
        arr = arrays.get(name)
        if arr is None or tuple(arr.shape) != tuple(p.value.shape):
            got = None if arr is None else tuple(arr.shape)
            raise ModelLoadError(f"draft head {w_path}: weight {name} is {got}, expected {tuple(p.value.shape)}")
        p.update(from_numpy(np.array(arr, dtype=np.float32), backend=backend))  # a copy: writable (fine-tuning)
        p.value.requires_grad_(False)
    return head


# -- training loss -------------------------------------------------------------------------------

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
