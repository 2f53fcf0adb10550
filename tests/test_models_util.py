"""Helpers for the models tests: tiny random Qwen2 checkpoints (transformers), tiny BPE tokenizers,
and GGUF files written with gguf.GGUFWriter. No tests here."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

import numpy as np

DATA = Path(__file__).resolve().parents[1] / "data"  # the repository's own copy
GSM8K = DATA / "gsm8k" / "test.jsonl"

QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# A Qwen2.5-style ChatML template (same constructs as the real one: system default, loop, generation prompt).
QWEN_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# A DeepSeek-R1-style template (namespace, bos_token, </think> stripping, <think> generation prompt).
R1_TEMPLATE = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{% set ns = namespace(system_prompt='') %}{%- for message in messages %}{%- if message['role'] == 'system' %}"
    "{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}{{bos_token}}{{ns.system_prompt}}"
    "{%- for message in messages %}{%- if message['role'] == 'user' %}{{'<｜User｜>' + message['content']}}{%- endif %}"
    "{%- if message['role'] == 'assistant' %}{% set content = message['content'] %}"
    "{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor -%}"
    "{% if add_generation_prompt %}{{'<｜Assistant｜><think>\\n'}}{% endif %}"
)


def gsm8k_texts(n: int = 50) -> list[str]:
    """The first n GSM8K question + answer texts (data/gsm8k, read-only)."""
    out = []
    with open(GSM8K) as f:
        for line in f:
            d = json.loads(line)
            out.append(d["question"] + "\n" + d["answer"])
            if len(out) >= n:
                break
    return out


@lru_cache(maxsize=4)
def tiny_bpe(vocab_size: int = 400, specials: tuple[str, ...] = tuple(SPECIALS)) -> Any:
    """A byte-level BPE (Qwen2 split regex) trained on GSM8K text, special tokens at the end."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tk.train_from_iterator(gsm8k_texts(400), trainer)
    from tokenizers import AddedToken

    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tk


def bpe_tables(tk: Any) -> tuple[list[str], list[str], list[int]]:
    """(tokens by id, merges "a b", llama.cpp token types) of a tokenizers BPE."""
    j = json.loads(tk.to_str())
    vocab = dict(j["model"]["vocab"])
    types = {}
    for a in j["added_tokens"]:
        vocab[a["content"]] = a["id"]
        types[a["id"]] = 3 if a["special"] else 4
    tokens = [None] * (max(vocab.values()) + 1)
    for t, i in vocab.items():
        tokens[i] = t
    merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    return tokens, merges, [types.get(i, 1) for i in range(len(tokens))]


def hf_qwen2(seed: int = 0, **overrides: Any) -> Any:
    """A random float32 transformers Qwen2ForCausalLM (eval mode); weights scaled up to be non-trivial."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    kw: dict[str, Any] = dict(vocab_size=403, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0, rms_norm_eps=1e-6,
                              tie_word_embeddings=False, max_position_embeddings=256, attn_implementation="eager")
    kw.update(overrides)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**kw)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    return model


def save_hf(model: Any, folder: Path, tokenizer: Optional[Any] = None, template: Optional[str] = QWEN_TEMPLATE) -> Path:
    """save_pretrained (safetensors) plus tokenizer.json / tokenizer_config.json when given."""
    model.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save(str(folder / "tokenizer.json"))
        cfg = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
               "tokenizer_class": "Qwen2Tokenizer", "chat_template": template}
        (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


_GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
}


def hf_to_gguf_name(name: str) -> str:
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    parts = name.split(".")  # model.layers.{i}.<rest>
    return f"blk.{parts[2]}.{_GGUF_NAMES['.'.join(parts[3:])]}"


def write_gguf(path: Path, model: Any, tokenizer: Any, qtype: str = "F32", template: str = QWEN_TEMPLATE,
               raw_override: Optional[dict[str, tuple[np.ndarray, Any]]] = None) -> Path:
    """Write a transformers Qwen2 model + tokenizer as a qwen2 GGUF; 2-D weights stored as `qtype`."""
    import gguf
    from gguf import GGMLQuantizationType as Q

    cfg = model.config
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    tokens, merges, types = bpe_tables(tokenizer)
    tokens = tokens + [f"[PAD{i}]" for i in range(len(tokens), cfg.vocab_size)]
    types = types + [5] * (cfg.vocab_size - len(types))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(template)
    raw_override = raw_override or {}
    for name, p in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        gname = hf_to_gguf_name(name)
        if gname in raw_override:
            data, t = raw_override[gname]
            w.add_tensor(gname, data, raw_dtype=t)
            continue
        arr = p.detach().numpy().astype(np.float32)
        if arr.ndim == 2 and qtype != "F32":
            t = Q[qtype]
            data = arr.astype(np.float16) if qtype == "F16" else gguf.quants.quantize(arr, t)
            w.add_tensor(gname, data, raw_dtype=t)
        else:
            w.add_tensor(gname, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def count_calls(monkeypatch: Any, owner: Any, name: str) -> dict[str, int]:
    """Wrap owner.name (monkeypatch: undone after the test) so that calls["n"] counts its calls; returns calls."""
    calls = {"n": 0}
    real = getattr(owner, name)

    def counted(*a: Any, **k: Any) -> Any:
        calls["n"] += 1
        return real(*a, **k)

    monkeypatch.setattr(owner, name, counted)
    return calls


def packed_tiny_qwen2(root: Path, seed: int) -> tuple[Any, Any]:
    """(model, tokenizer) of a tiny qwen2 written as a Q8_0 GGUF (256-wide rows) under `root` and loaded packed, so
    the CPU's one-call forward applies (tree steps, a packed head's draft steps)."""
    from minitorch.models import load_model

    hf = hf_qwen2(seed=seed, hidden_size=256, num_attention_heads=4, num_key_value_heads=2, intermediate_size=512,
                  num_hidden_layers=2, tie_word_embeddings=False)
    path = write_gguf(root / "tiny.gguf", hf, tiny_bpe(), qtype="Q8_0")
    return load_model(str(path), progress=False, weights="packed", cache_dir=root / "c")
