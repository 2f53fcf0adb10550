"""A trained draft head on the GPU (minitorch/models/draft_head.py's DraftHead): a one-layer CudaDecoder whose input
row is fc([feature ; embed(token)]) instead of embed(token), and whose output g (the layer's residual stream, no
final norm: what DraftHead.logits reads) goes through the target's own LM head over the first head_vocab ids.

    _embed   head_input_bf16 (kernels/draft_head.cu): x = [feature rows ; embedding rows] (T, 2H) bf16,
             resid = fc bias (and, for a round's first step, pos = the target's position - T)
    fc       resid += x @ fc^T (the decoder's _gemm_resid: our GEMV with the layer's input norm in its epilogue,
             or cuBLAS), then the layer's stages (_qkv, _attention, _o_proj, _mlp) as in CudaDecoder
    _head    head_feature_bf16: xn = bf16(g), feat = g's last row (the feature the next one-row step feeds
             back); the LM head over xn; argmax or sampling and the position advance (CudaDecoder._choose)

Where a step's features and tokens come from (`feed(source, T)`, one captured graph per source and T):
    "round"  the target's verify rows just accepted: its final normed hidden states (the target decoder's xn,
             rows 0..T-1: what its LM head read) and the tokens the acceptance kernel wrote (spec_out[1:T+1]:
             the accepted drafts and the correction or bonus); the head's position rolls back to the target's
             position - T first, so its cache holds only positions whose inputs were the target's features
    "self"   one row: the head's own last feature and its own last token (tokens[0], written by decode_advance)
    prompt   eager steps over the target's prefill chunks (`feed_rows`)

The embedding and the LM head are the target decoder's device arrays (shared, not copied). The head's position
is aligned with the target's: head position t reads (f_t, x_{t+1}); its history and q ring are laid out like a
draft decoder's, so the verify graph's gather_drafts and spec_accept read it as they read a draft model's.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Dict, Optional

import numpy as np

from .decoder import _NORMED, CudaDecoder, _bf16_bits

HEAD_SOURCES = ("round", "self")


def head_config(head_cfg: Any, target: Any) -> Any:
    """The one-layer decoder config of a head (a DraftHeadConfig or any object with its fields) over `target`
    (a CudaDecoder): the head's layer shapes, the target's vocabulary and context."""
    return SimpleNamespace(
        hidden_size=int(head_cfg.hidden_size), intermediate_size=int(head_cfg.intermediate_size),
        num_hidden_layers=1, num_attention_heads=int(head_cfg.num_attention_heads),
        num_key_value_heads=int(head_cfg.num_key_value_heads), head_dim=int(head_cfg.head_dim),
        vocab_size=int(target.V), rope_theta=float(head_cfg.rope_theta), rms_norm_eps=float(head_cfg.rms_norm_eps),
        tie_word_embeddings=True,
        max_position_embeddings=getattr(target.config, "max_position_embeddings", None) or target.max_len)


class HeadDecoder(CudaDecoder):
    """A DraftHead resident on the GPU over a target CudaDecoder. weights: the head's checkpoint-named arrays
    (`fc.weight` (H, 2H), `fc.bias`, `layer.*`; float32 numpy from `weights_from_model(head)`, or bf16 bits)."""

    def __init__(self, head_cfg: Any, weights: Dict[str, Any], target: Any, max_tokens: Optional[int] = None,
                 gemv: str = "draft", pdl: Optional[bool] = None, int8_weights: bool = False) -> None:
        """int8_weights: its steps of one (and, under gemv "ours", two) rows read 8-bit copies of fc, the layer's
        projections and the target LM head's first head_vocab rows (CudaDecoder's int8_weights; the copies are
        the head's own, the target keeps its bf16 rows): ~half the bytes of a drafting step."""
        if int(head_cfg.hidden_size) != target.H:
            raise ValueError(f"the draft head's hidden size {head_cfg.hidden_size} is not the target's {target.H}")
        for name in ("fc.weight", "fc.bias"):
            if name not in weights:
                raise ValueError(f"draft head weights lack {name}")
        self.target = target
        self.head_vocab = min(int(head_cfg.head_vocab), int(target.V))
        self._fc = (weights["fc.weight"], weights["fc.bias"])
        H = int(head_cfg.hidden_size)
        w: Dict[str, Any] = {"model.layers.0." + k[len("layer."):]: v for k, v in weights.items() if k.startswith("layer.")}
        w["model.embed_tokens.weight"] = target.embed
        w["model.norm.weight"] = np.ones(H, np.float32)  # unused: the head has no final norm
        super().__init__(head_config(head_cfg, target), w, max_len=target.max_len,
                         max_tokens=int(max_tokens or target.max_tokens), gemv=gemv, pdl=pdl,
                         int8_weights=int8_weights,
                         graph_prefill=False)  # it never prefills itself: feed_rows reads the target's chunks
        self._src = self._sources("self")

    # ------------------------------------------------------------------ setup
    def _load_weights(self, weights: Dict[str, Any]) -> None:
        super()._load_weights(weights)
        cp = self.cp
        self.embed, self.lm_head = self.target.embed, self.target.lm_head  # the target's arrays, shared
        fw = _bf16_bits(cp, self._fc[0])
        if tuple(fw.shape) != (self.H, 2 * self.H):
            raise ValueError(f"draft head fc.weight is {tuple(fw.shape)}, expected {(self.H, 2 * self.H)}")
        self.fc_w = cp.ascontiguousarray(fw)
        b = self._fc[1]
        self.fc_b = (cp.asarray(b, dtype=cp.float32) if str(b.dtype) != "uint16"
                     else (cp.asarray(b).astype(cp.uint32) << 16).view(cp.float32)).reshape(self.H)
        self._fc = None

    def _int8_rows(self) -> "list[tuple[Any, int]]":
        """CudaDecoder's (the layer's projections) with fc, and of the LM head only its first head_vocab rows (the
        only ones a head reads)."""
        return [(w, n) for w, n in super()._int8_rows() if w is not self.lm_head] + \
            [(self.fc_w, self.H), (self.lm_head, self.head_vocab)]

    def _alloc_buffers(self) -> None:
        super()._alloc_buffers()
        cp = self.cp
        self.xcat = cp.zeros((self.max_tokens, 2 * self.H), cp.uint16)  # [feature ; embedding] rows
        self.feat = cp.zeros(self.H, cp.uint16)  # the head's last output feature (bf16 of g's last row)

    def _sources(self, source: str) -> tuple:
        """(feature rows, token ids, position to roll back from or None) of a step source."""
        t = self.target
        if source == "round":
            return (t.xn, t.spec_out[1:], t.pos)
        if source == "self":
            return (self.feat, self.tokens, None)
        raise ValueError(f"unknown draft head source {source!r} (one of {', '.join(HEAD_SOURCES)})")

    # ------------------------------------------------------------------ one step (capturable)
    def _step(self, T: int, all_logits: bool, advance: bool) -> None:
        plan = self._plan(T)
        lw = self.layers[0]
        self._embed(T)
        delta = self._gemm_resid(self.xcat, self.fc_w, self.o, T, self.H, 2 * self.H, nw=lw["ln1"],
                                 split=plan.split_norm)
        self._qkv(lw, T, delta, plan)
        self._attention(lw, T, plan)
        delta = self._o_proj(lw, T, plan)
        delta = self._mlp(lw, T, delta, plan, None, True)  # no norm after the layer: the residual stays as is
        self._head(T, all_logits, advance, delta)

    def _embed(self, T: int) -> None:
        feat, tok, tpos = self._src
        i32 = np.int32
        self.k.launch("head_input_bf16", (T,), (256,),
                      (feat, tok, self.embed, self.fc_b, self.xcat, self.resid, self.pos,
                       tpos if tpos is not None else np.uint64(0), i32(T), i32(self.H), i32(self.V)))

    def _head(self, T: int, all_logits: bool, advance: bool, delta: Optional[Any]) -> None:
        if delta is _NORMED:  # cannot happen: _mlp was given no norm to write
            raise RuntimeError("draft head: the layer's output was normalised")
        i32 = np.int32
        self.k.launch("head_feature_bf16", (T,), (256,),
                      (self.resid, delta if delta is not None else np.uint64(0), self.xn, self.feat, i32(T),
                       i32(self.H)))
        r0 = 0 if all_logits else T - 1
        self._gemm(self.xn[r0:T], self.lm_head, self.logits, T - r0, self.nv, self.H, out_f32=True)
        self._choose(T, all_logits, advance)

    # ------------------------------------------------------------------ host API
    def feed(self, source: str, T: int) -> None:
        """Replay (capturing on first use) the head's step over T rows from `source` ("round" or "self"),
        ending in its next token (history, tokens[0], the q ring when sampling) and the position advance."""
        src = self._sources(source)
        if not 1 <= T <= self.max_tokens or (source == "self" and T != 1):
            raise ValueError(f"a draft head step from {source!r} takes {'1' if source == 'self' else f'1..{self.max_tokens}'} "
                             f"rows, got {T}")

        def run(advance: bool) -> None:
            self._src = src
            self._step(T, False, advance)

        def warm() -> None:  # the eager step before a capture must leave the inputs as they were: it writes
            # the next feature (head_feature_bf16) and token over this step's own, and a "round" step moves the
            # position; without the restore, each graph's first replay drafted from the warm step's outputs
            saved = (self.feat.copy(), self.tokens[:1].copy(), self.pos.copy())
            run(False)
            self.feat[...] = saved[0]
            self.tokens[:1] = saved[1]
            self.pos[...] = saved[2]

        if source == "round":
            self.graph_refs[("head", source)] = self.target
        self.graph(("head", source, T, self.sampling), lambda: run(True), warm)

    def feed_rows(self, feats: Any, ids: Any) -> None:
        """An eager step over len(ids) <= max_tokens rows (the prompt): features `feats` (a device bf16 array of
        at least len(ids) rows of H, e.g. a slice of the target's xn) and host token ids."""
        T = len(ids)
        if not 1 <= T <= self.max_tokens:
            raise ValueError(f"a step takes 1..{self.max_tokens} tokens, got {T}")
        with self.stream:
            self.tokens[:T].set(np.asarray(ids, np.int64), stream=self.stream)
            self._src = (feats, self.tokens, None)
            self._step(T, False, True)

    def set_feature(self, feat_row: Any, token: int) -> None:
        """The next "self" step's inputs: a feature row (device bf16, H values) and a token id."""
        with self.stream:
            self.feat[...] = feat_row.reshape(self.H)
            self.tokens[:1].set(np.asarray([int(token)], np.int64), stream=self.stream)
