"""Qwen2 decoder (= DeepSeek-R1-Distill-Qwen) on MiniTorch tensors, with a KV cache.

References: mlx-lm models/qwen2.py (structure; attribute names = checkpoint keys so loading is
"set parameter by name") and transformers modeling_qwen2.py (numerics: RMSNorm in float32,
rotate_half rotary embeddings, grouped-query attention with q/k/v biases, SwiGLU MLP,
scaling = head_dim ** -0.5). Every op goes through a backend slot (nn.rmsnorm, nn.rope,
nn.attention, nn.linear, nn.silu_mul, nn.embedding); the model never looks at the device.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np

from .. import nn
from .. import tensor as make_tensor
from ..module import Module, Parameter
from ..tensor import Tensor
from .config import Qwen2Config
from .kv_cache import KVCache
from .tree_step import tree_layout


def _unset() -> Parameter:
    """An empty parameter slot; `Qwen2ForCausalLM.load_weights` fills it with the checkpoint tensor.
    Inference weights do not require grad (tests turn it on for gradient checks)."""
    return Parameter(None, requires_grad=False)


class Linear(Module):
    """y = x @ weight^T + bias with weight (out_features, in_features) as stored in checkpoints."""

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = _unset()
        self.bias = _unset() if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return nn.linear(x, self.weight.value, None if self.bias is None else self.bias.value)


class RMSNorm(Module):
    def __init__(self, dims: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = _unset()

    def forward(self, x: Tensor) -> Tensor:
        return nn.rmsnorm(x, self.weight.value, self.eps)


class Embedding(Module):
    def __init__(self, num: int, dims: int) -> None:
        super().__init__()
        self.weight = _unset()

    def forward(self, ids: Tensor) -> Tensor:
        return nn.embedding(self.weight.value, ids)


class Attention(Module):
    """Grouped-query self-attention with rotary embeddings and q/k/v biases."""

    def __init__(self, cfg: Qwen2Config) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.scale = self.head_dim**-0.5
        d = cfg.hidden_size
        self.q_proj = Linear(d, self.n_heads * self.head_dim, True)
        self.k_proj = Linear(d, self.n_kv_heads * self.head_dim, True)
        self.v_proj = Linear(d, self.n_kv_heads * self.head_dim, True)
        self.o_proj = Linear(self.n_heads * self.head_dim, d, False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: Optional[KVCache] = None, layer: int = 0) -> Tensor:
        b, t, _ = x.shape
        hd = self.head_dim
        q = self.q_proj(x).view(b, t, self.n_heads, hd).permute(0, 2, 1, 3)  # (B, Hq, T, hd)
        k = self.k_proj(x).view(b, t, self.n_kv_heads, hd).permute(0, 2, 1, 3)  # (B, Hkv, T, hd)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, hd).permute(0, 2, 1, 3)  # (B, Hkv, T, hd)
        q = nn.rope(q, cos, sin)
        k = nn.rope(k, cos, sin)
        start = 0
        if cache is not None:
            start = cache.length
            k, v = cache.update(layer, k, v)  # (B, Hkv, start + T, hd)
        o = nn.attention(q, k, v, self.scale, start)  # (B, Hq, T, hd)
        o = o.permute(0, 2, 1, 3).contiguous().view(b, t, self.n_heads * hd)  # (B, T, Hq * hd)
        return self.o_proj(o)


class MLP(Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, dims: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = Linear(dims, hidden, False)
        self.up_proj = Linear(dims, hidden, False)
        self.down_proj = Linear(hidden, dims, False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(nn.silu_mul(self.gate_proj(x), self.up_proj(x)))


class DecoderLayer(Module):
    """Pre-norm transformer block: x + attn(norm(x)), then + mlp(norm(.))."""

    def __init__(self, cfg: Qwen2Config) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: Optional[KVCache] = None, layer: int = 0) -> Tensor:
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, layer)
        return h + self.mlp(self.post_attention_layernorm(h))


class Layers(Module):
    """Numbered children, so parameter names read `layers.0.self_attn.q_proj.weight`."""

    def __init__(self, layers: Sequence[Module]) -> None:
        super().__init__()
        self.n = len(layers)
        for i, layer in enumerate(layers):
            setattr(self, str(i), layer)

    def __getitem__(self, i: int) -> DecoderLayer:
        return getattr(self, str(i))

    def __len__(self) -> int:
        return self.n


class Qwen2Model(Module):
    def __init__(self, cfg: Qwen2Config) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = Layers([DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


def join_layer_projections(layer: "DecoderLayer") -> int:
    """Qwen2ForCausalLM.join_projections for one decoder layer (a model's, or a draft head's): its q/k/v (as many
    from q on as share one code form) and gate/up, where they are PackedWeights, joined into one weight each
    (`owner.joined` = (weight, n, the views)), the separate weights becoming views of it. Returns how many joins
    were made."""
    from ..packed import PackedWeight

    made = 0
    a, m = layer.self_attn, layer.mlp
    for owner, lins in ((a, (a.q_proj, a.k_proj, a.v_proj)), (m, (m.gate_proj, m.up_proj))):
        owner.joined = None
        ws = [lin.weight.value for lin in lins]
        n = 1
        while n < len(ws) and all(isinstance(w, PackedWeight) for w in ws[:n + 1]) and ws[n - 1].joins(ws[n]):
            n += 1
        if n < 2:
            continue
        fused = PackedWeight.concat(ws[:n])
        starts = np.cumsum([0] + [w.shape[0] for w in ws[:n - 1]])
        views = tuple(fused.narrow(0, int(s0), w.shape[0]) for s0, w in zip(starts, ws[:n]))
        for lin, view in zip(lins, views):
            lin.weight.update(view)
        owner.joined = (fused, n, views)
        made += 1
    return made


def layer_weights(layer: "DecoderLayer") -> Any:
    """One decoder layer's LayerWeights for a backend's one-call forward (its joined weights where still valid)."""
    from ..tensor_ops import LayerWeights

    a, m = layer.self_attn, layer.mlp
    return LayerWeights(layer.input_layernorm.weight.value, a.q_proj.weight.value, _bias(a.q_proj),
                        a.k_proj.weight.value, _bias(a.k_proj), a.v_proj.weight.value, _bias(a.v_proj),
                        a.o_proj.weight.value, layer.post_attention_layernorm.weight.value,
                        m.gate_proj.weight.value, m.up_proj.weight.value, m.down_proj.weight.value,
                        _joined(a, (a.q_proj, a.k_proj, a.v_proj)), _joined(m, (m.gate_proj, m.up_proj)))


class StackCache:
    """A model's DecoderStacks (backend.decoder_forward's weights and tables), one per key, each kept while the
    objects it was built from are the very ones the model holds now: a weight set since (which also undoes a
    join: _joined), grown rotary tables or a new activation mode on a weight build it anew."""

    def __init__(self) -> None:
        self._entries: dict[Any, tuple[list[Any], Any]] = {}

    def get(self, key: Any, sources: tuple, build: Callable[[], Any]) -> Any:
        flat = _flatten(sources)
        hit = self._entries.get(key)
        if hit is None or len(hit[0]) != len(flat) or not all(_same(a, b) for a, b in zip(hit[0], flat)):
            hit = (flat, build())
            self._entries[key] = hit
        return hit[1]


def _flatten(x: Any) -> list[Any]:
    return [y for item in x for y in _flatten(item)] if isinstance(x, (tuple, list)) else [x]


def _same(a: Any, b: Any) -> bool:
    """The same object, or an equal plain value (a count, a mode name)."""
    return a is b or (type(a) is type(b) and isinstance(a, (int, float, str)) and a == b)


def _joined(owner: Module, lins: Sequence[Linear]) -> Optional[tuple]:
    """(weight, n) of owner's join (join_layer_projections) while its projections still hold the views the join set
    (a weight set since then undoes the join for this layer), else None."""
    j = getattr(owner, "joined", None)
    if j is None or any(lin.weight.value is not view for lin, view in zip(lins, j[2])):
        return None
    return j[0], j[1]


def _bias(lin: Linear) -> Optional[Tensor]:
    return None if lin.bias is None else lin.bias.value


def rope_tables(head_dim: int, theta: float, n_pos: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin tables (n_pos, head_dim) in transformers' float32 arithmetic (inv_freq, outer, cat)."""
    inv_freq = 1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)))
    freqs = np.arange(n_pos, dtype=np.float32)[:, None] * inv_freq[None, :].astype(np.float32)  # (n_pos, hd/2)
    emb = np.concatenate([freqs, freqs], axis=-1)  # (n_pos, hd)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


class Qwen2ForCausalLM(Module):
    """The full causal LM: `model(ids, cache)` -> (1, T, V) logits for the T new positions."""

    def __init__(self, config: Qwen2Config, backend: Any, dtype: str = "float32") -> None:
        super().__init__()
        self.config = config
        self.backend = backend
        self.dtype = dtype
        self.model = Qwen2Model(config)
        self.lm_head = None if config.tie_word_embeddings else Linear(config.hidden_size, config.vocab_size, False)
        # the backend's one-call forward where it has one (FastBackend over packed weights: cpu/decoder.py,
        # the same kernels in the same order, so the same bits); False runs the model op by op
        self.fused = True
        self._cos: Optional[Tensor] = None
        self._sin: Optional[Tensor] = None
        self._stacks = StackCache()  # the one-call forward's DecoderStack, per head_rows

    # -- inference ---------------------------------------------------------------------------
    def new_cache(self, max_len: int) -> KVCache:
        """An empty KV cache for up to max_len positions (rotary tables are grown to match)."""
        c = self.config
        if max_len > c.max_position_embeddings:
            raise ValueError(f"max_len {max_len} exceeds the model's context of {c.max_position_embeddings} positions")
        self._ensure_rope(max_len)
        return KVCache(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, max_len, self.backend, self.dtype)

    def _ensure_rope(self, n_pos: int) -> None:
        if self._cos is None or self._cos.shape[0] < n_pos:
            from .. import from_numpy

            cos, sin = rope_tables(self.config.head_dim, self.config.rope_theta, n_pos)
            self._cos = _cast(from_numpy(cos, backend=self.backend), self.dtype)
            self._sin = _cast(from_numpy(sin, backend=self.backend), self.dtype)

    def forward(self, ids: Union[Tensor, Sequence[int]], cache: Optional[KVCache] = None,
                last_n: Optional[int] = None, head_rows: Optional[int] = None,
                return_hidden: bool = False, parents: Optional[Sequence[int]] = None) -> Union[Tensor, tuple[Tensor, Tensor]]:
        """Logits (1, T, V) for ids (1, T); with a cache, positions continue from cache.length. Without a cache
        ids may be a batch (B, T) of sequences (right-padded: a causal position never reads a later one), e.g.
        the target's features for training a draft head.

        last_n: only return logits for the last n positions, (1, n, V); a prefill that needs just the
        next-token distribution skips most of the vocabulary projection (V x D per position).
        head_rows: only the logits of token ids 0 .. head_rows-1, (1, T, head_rows): a draft restricted
        to the common tokens reads a slice of the vocabulary projection (a view, no copy).
        parents: a tree step (models/tree_step.py): row t under row parents[t] (-1: under the cache), at position
        cache.length + its depth, seeing the cache, its ancestors and itself; the CPU's one-call forward only."""
        if not isinstance(ids, Tensor):
            ids = make_tensor([list(ids)], dtype="int64", backend=self.backend)
        if ids.dims != 2 or ids.shape[0] < 1 or (ids.shape[0] != 1 and cache is not None):
            raise ValueError(f"ids must have shape (1, T) (or (B, T) without a cache), got {ids.shape}")
        t = ids.shape[1]
        start = 0
        if cache is not None:
            cache.check_room(t)
            start = cache.length
        self._ensure_rope(start + t)
        cos = self._cos.narrow(0, start, t)  # (T, hd)
        sin = self._sin.narrow(0, start, t)  # (T, hd)
        if last_n is not None and not 1 <= last_n <= t:
            raise ValueError(f"last_n must be in [1, {t}], got {last_n}")
        stack = self._fused(head_rows) if ids.shape[0] == 1 else None
        tree = None
        if parents is not None:
            if stack is None or cache is None or len(parents) != t:
                raise ValueError("a tree step (parents=) needs a cache, one parent a row and the CPU's one-call forward "
                                 "(packed weights, float32 activations, no gradient)")
            tree = tree_layout(parents, start)  # positions up to start + t - 1: the tables cover them
        if stack is not None:
            return self._fused_forward(stack, ids, cache, last_n, return_hidden, tree)
        h = self.model.embed_tokens(ids)  # (1, T, D)
        for i in range(len(self.model.layers)):
            h = self.model.layers[i](h, cos, sin, cache, i)
        if cache is not None:
            cache.advance(t)
        hidden = None
        if return_hidden:
            hidden = h = self.model.norm(h)  # (1, T, D)
            if last_n is not None:
                h = h.narrow(1, t - last_n, last_n)  # (1, last_n, D)
        else:
            if last_n is not None:
                h = h.narrow(1, t - last_n, last_n)  # (1, last_n, D)
            h = self.model.norm(h)
        logits = nn.linear(h, self._head(head_rows))  # (1, T, V)
        return (logits, hidden) if return_hidden else logits

    def _head(self, head_rows: Optional[int]) -> Any:
        head = self.lm_head_weight()
        if head_rows is not None:
            if not 1 <= head_rows <= head.shape[0]:
                raise ValueError(f"head_rows must be in [1, {head.shape[0]}], got {head_rows}")
            head = head.narrow(0, 0, head_rows)  # a Tensor view or a PackedWeight sharing the arrays
        return head

    def _fused(self, head_rows: Optional[int]) -> Optional[Any]:
        """The DecoderStack for the backend's one-call forward (backend.decoder_forward), or None: no such slot,
        `fused` turned off, a gradient being recorded, or weights its kernel does not take. Built once per
        head_rows and kept while its weights and rotary tables are the model's (StackCache)."""
        from ..autodiff import is_grad_enabled
        from ..tensor_ops import DecoderStack

        fwd = getattr(self.backend, "decoder_forward", None)
        if fwd is None or not self.fused or self.dtype != "float32" or is_grad_enabled():
            return None
        layers = tuple(layer_weights(layer) for layer in (self.model.layers[i] for i in range(len(self.model.layers))))
        embed, norm, lm = self.model.embed_tokens.weight.value, self.model.norm.weight.value, self.lm_head_weight()
        c = self.config
        stack = self._stacks.get(
            head_rows, (layers, embed, norm, lm, getattr(lm, "activations", None), self._cos, self._sin),
            lambda: DecoderStack(embed, layers, norm, self._head(head_rows), float(c.rms_norm_eps),
                                 c.num_attention_heads, c.num_key_value_heads, c.head_dim, self._cos, self._sin))
        return stack if self.backend.decoder_supports(stack) else None

    def _fused_forward(self, stack: Any, ids: Tensor, cache: Optional[KVCache], last_n: Optional[int],
                       return_hidden: bool, tree: Optional[tuple] = None) -> Union[Tensor, tuple[Tensor, Tensor]]:
        from .. import from_numpy

        extra = {} if tree is None else {"tree": tree}
        logits, hidden = self.backend.decoder_forward(
            stack, ids=np.ascontiguousarray(ids.to_numpy()[0], dtype=np.int64), cache=cache, last_n=last_n,
            return_hidden=return_hidden, **extra)
        out = from_numpy(logits[None], backend=self.backend)
        return (out, from_numpy(hidden[None], backend=self.backend)) if return_hidden else out

    def lm_head_weight(self) -> Any:
        """The vocabulary projection (V, D): lm_head's weight, or the tied embedding."""
        return self.model.embed_tokens.weight.value if self.lm_head is None else self.lm_head.weight.value

    # -- weights -----------------------------------------------------------------------------
    def packed_weights(self) -> list[Any]:
        """The PackedWeights among this model's parameters (a GGUF model on the CPU backend), e.g. to give them
        their own activation mode (minitorch/cpu/packed.py set_weight_activations)."""
        from ..packed import PackedWeight

        own = [p.value for _, p in self.named_parameters() if isinstance(p.value, PackedWeight)]
        joined = [m.joined[0] for layer in (self.model.layers[i] for i in range(len(self.model.layers)))
                  for m in (layer.self_attn, layer.mlp) if getattr(m, "joined", None) is not None]
        return own + joined  # the joined weights too: the one-call forward computes with them

    def join_projections(self) -> int:
        """Join each layer's q/k/v projections (as many from q on as share one code form) and its gate/up into one
        PackedWeight each (PackedWeight.concat), the separate weights becoming views of it (no second copy), so
        that the one-call forward runs one product where it ran two or three: the same bits, fewer calls (a 1.5B
        token: 197 product calls became 127; the whole decode step and 5-row verify took 0.96-1.06x as long in
        float32, 0.99-1.12x with int8 activations, over four alternating runs on a 2-core box:
        tools/cpu_read_ceiling.py, docs/history/RESULTS_LOG.md). Packed weights only (GGUF on the CPU); returns how many
        joined weights were made. load_weights calls it; a later change of one of the weights undoes it for
        that layer (_joined checks the views)."""
        made = 0
        for layer in (self.model.layers[i] for i in range(len(self.model.layers))):
            made += join_layer_projections(layer)
        return made

    def load_weights(self, weights: Mapping[str, np.ndarray], source: str = "") -> None:
        """Set every parameter from checkpoint arrays keyed by HF name (float32 numpy, may be mmaps, or
        PackedWeight: kept packed where the backend has a packed kernel, else rebuilt as float32)."""
        from .. import from_numpy
        from ..packed import PackedWeight
        from .errors import ModelLoadError

        for name, param in self.named_parameters():
            arr = weights.get(name)
            if arr is None:
                raise ModelLoadError(f"checkpoint {source} lacks weight {name}")
            expected = self.expected_shape(name)
            if tuple(arr.shape) != expected:
                raise ModelLoadError(f"checkpoint {source}: weight {name} has shape {tuple(arr.shape)}, expected {expected}")
            if isinstance(arr, PackedWeight):
                if getattr(self.backend, "packed_linear", None) is not None:
                    param.update(arr)
                    continue
                arr = arr.dequantize()
            param.update(_cast(from_numpy(np.ascontiguousarray(arr, dtype=np.float32), backend=self.backend), self.dtype))
        self.join_projections()

    def expected_shape(self, name: str) -> tuple[int, ...]:
        """Checkpoint shape of parameter `name` (HF key)."""
        c = self.config
        d, hd = c.hidden_size, c.head_dim
        leaf = name.split(".")[-2] + "." + name.split(".")[-1]
        table = {
            "embed_tokens.weight": (c.vocab_size, d), "lm_head.weight": (c.vocab_size, d),
            "q_proj.weight": (c.num_attention_heads * hd, d), "q_proj.bias": (c.num_attention_heads * hd,),
            "k_proj.weight": (c.num_key_value_heads * hd, d), "k_proj.bias": (c.num_key_value_heads * hd,),
            "v_proj.weight": (c.num_key_value_heads * hd, d), "v_proj.bias": (c.num_key_value_heads * hd,),
            "o_proj.weight": (d, c.num_attention_heads * hd),
            "gate_proj.weight": (c.intermediate_size, d), "up_proj.weight": (c.intermediate_size, d),
            "down_proj.weight": (d, c.intermediate_size),
        }
        return table.get(leaf, (d,))  # the norms

    _expected_shape = expected_shape  # older name, used by tests in other areas


def _cast(t: Tensor, dtype: str) -> Tensor:
    return t if t.dtype == dtype else t.to(dtype)
