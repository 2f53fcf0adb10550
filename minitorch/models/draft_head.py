"""A trained draft head (EAGLE, Li et al. 2024, arXiv 2401.15077): one decoder layer on the target's features.

At context position t the head reads the target's final hidden state f_t (after the final norm: what the
target's LM head reads) and the embedding of the next token x_{t+1}, and predicts the target's next feature:

    g_t = layer(fc([f_t ; embed(x_{t+1})]))        fc: (2D -> D), layer: one Qwen2 decoder block
    logits_t = g_t @ lm_head[:head_vocab]^T      the target's own, frozen LM head: predicts x_{t+2}

so it is trained towards g_t ~ f_{t+1} (SmoothL1) and softmax(logits_t) ~ the target's distribution at t+1
(soft cross-entropy), EAGLE's loss. When drafting, the features of positions the target has not verified yet
are the head's own outputs g. The head owns fc and the layer; the embedding and the LM head are the target's,
so a head file is small and only drafts for the target it was trained on (`target_fingerprint`).

Training (project/train_draft_head.py, project/training/) builds on this file: the loss and EAGLE-3's
training-time test (the head run on its own outputs) live there, the head's files in head_io.py.

The head proposes among the first `head_vocab` token ids only (byte-level BPE ids run roughly by frequency;
FR-Spec, arXiv 2502.14856): its LM head reads that slice of the target's. Drafting stays lossless: the target
verifies every token.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import numpy as np

from .. import nn
from ..module import Module, Parameter
from ..tensor import Tensor
from ..tensor_functions import from_numpy
from .config import Qwen2Config
from .errors import ModelLoadError
from .kv_cache import KVCache
from .qwen2 import DecoderLayer, StackCache, rope_tables

HEAD_FORMAT = "minitorch-spec-draft-head/1"  # head.json's "format" (head_io.py writes and reads the files)


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

    `forward(feats, next_ids_emb)` runs whole sequences for training; `draft_step` runs new positions over a KV
    cache for drafting. Both return the head's features g (B, T, D); `logits(g, lm_head)` projects them.
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

    def rope(self, start: int, t: int) -> tuple[Tensor, Tensor]:
        """cos, sin (T, hd) of positions start..start+T-1 (the tables grow to cover them)."""
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
        cos, sin = self.rope(start, t)
        x = self.fc(nn.cat([feats, emb], -1))  # (B, T, D)
        g = self.layer(x, cos, sin, cache, 0)
        if cache is not None:
            cache.advance(t)
        return g

    # -- drafting --------------------------------------------------------------------------------
    def packed_weights(self) -> list[Any]:
        """The PackedWeights among the head's parameters and its layer's joined products (a packed() head), e.g. to
        give them the target's activation mode (minitorch/cpu/packed.py set_weight_activations)."""
        from ..packed import PackedWeight

        own = [p.value for _, p in self.named_parameters() if isinstance(p.value, PackedWeight)]
        joined = [m.joined[0] for m in (self.layer.self_attn, self.layer.mlp) if getattr(m, "joined", None) is not None]
        return own + joined

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
                   rows: int, tree: Any = None, kv_only: bool = False) -> tuple[Optional[Tensor], Optional[Tensor]]:
        """One drafting step over new positions (B = 1): (g of the last position (1, 1, D), its logits over the
        first `rows` ids (1, 1, rows)), as forward + logits compute them. On a backend with a one-call forward
        (the CPU's decoder_forward) and packed weights (packed()), one call after fc: the same kernels in the
        same order as forward + logits, so the same bits (tests/test_draft_head.py).
        tree: a TreeStep (models/tree_step.py), one level of a draft tree, each row seeing its own ancestors; then g
        and the logits of every row, (1, T, D) and (1, T, rows). The one-call forward only.
        kv_only: positions whose outputs nobody reads (the prompt's, HeadDrafter.observe): only their K/V enter the
        cache; returns (None, None). On the one-call forward that is fc, the input norm and the k/v products (on the
        1.5B target's head about a quarter of the whole step's time; decoder_forward's kv_only: the same K/V bits);
        the module path runs the whole step."""
        from ..autodiff import is_grad_enabled

        fwd = getattr(self.backend, "decoder_forward", None)
        t = feats.shape[1]
        stack = None
        if fwd is not None and not is_grad_enabled() and feats.shape[0] == 1:
            cache.check_room(t)
            self.rope(cache.length, t)  # the tables cover the new positions (before the stack reads them)
            stack = self._stack(lm_head, rows)
        if stack is None or not self.backend.decoder_supports(stack):
            if tree is not None:
                raise ValueError("a tree step of the head needs the CPU's one-call forward (a packed() head)")
            out = self._step_by_ops(feats, emb, cache, lm_head, rows)
            return (None, None) if kv_only else out
        x = self.fc(nn.cat([feats, emb], -1))  # (1, T, D): forward's first op
        if kv_only:
            if tree is not None:
                raise ValueError("draft_step: kv_only is for a chain of positions, not a tree level")
            return fwd(stack, x0=x.to_numpy()[0], cache=cache, kv_only=True)
        if tree is not None:
            logits, hidden = fwd(stack, x0=x.to_numpy()[0], cache=cache, return_hidden=True, tree=tree)
            return from_numpy(hidden[None], backend=self.backend), from_numpy(logits[None], backend=self.backend)
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
