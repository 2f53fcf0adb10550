"""Tokenizer and chat template through the `tokenizers` library (never transformers at run time).

Sources:
  * a model folder: tokenizer.json (+ tokenizer_config.json / chat_template.jinja / generation_config.json);
  * a GGUF file: byte-level BPE rebuilt from `tokenizer.ggml.*` metadata exactly as transformers'
    GGUF loader does (integrations/gguf/gguf_tokenizer_mapping.py: vocabulary respelled into the
    byte alphabet, the file's merges, control tokens as special added tokens, user-defined tokens as
    plain added tokens, Qwen2 split regex + ByteLevel), saved as tokenizer.json in the cache folder.

The chat template is rendered with jinja2 the way transformers does (trim_blocks, lstrip_blocks,
loopcontrols, `raise_exception`, a non-escaping `tojson`), with the special tokens as variables.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Optional, Union

from .errors import IncompatibleModelsError, ModelLoadError

# Qwen2's pre-tokenizer split (transformers models/qwen2/tokenization_qwen2.py PRETOKENIZE_REGEX).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GGUF_PRE_TOKENIZERS = {"qwen2": QWEN2_SPLIT, "deepseek-r1-qwen": QWEN2_SPLIT}
# End-of-turn / end-of-text tokens that stop generation whenever the vocabulary has them.
KNOWN_STOP_TOKENS = ("<|im_end|>", "<|endoftext|>", "<｜end▁of▁sentence｜>", "<|EOT|>", "<|eot_id|>", "<|end_of_text|>")
_CONTROL, _USER_DEFINED, _UNUSED = 3, 4, 5  # llama.cpp token types


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (the ByteLevel alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


class Tokenizer:
    """Encode / decode / chat template / stop tokens of one model (wraps a `tokenizers.Tokenizer`)."""

    def __init__(
        self,
        backend: Any,
        chat_template: Optional[str] = None,
        special_tokens: Optional[dict[str, Optional[str]]] = None,
        stop_token_ids: Optional[set[int]] = None,
        vocab_size: Optional[int] = None,
        source: str = "",
    ) -> None:
        self.backend = backend
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})
        self.vocab_size = int(vocab_size if vocab_size is not None else backend.get_vocab_size(with_added_tokens=True))
        self.stop_token_ids = set(stop_token_ids or ())
        self.source = source
        self._compiled = None

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; adds no BOS/EOS (chat templates write their own special tokens)."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`."""
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_table(self) -> list[Optional[str]]:
        """id -> token string for ids below vocab_size (None for holes)."""
        table: list[Optional[str]] = [None] * self.vocab_size
        for tok, i in self.backend.get_vocab(with_added_tokens=True).items():
            if i < self.vocab_size:
                table[i] = tok
        return table

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """Render `messages` ([{"role": ..., "content": ...}]) with the model's own chat template."""
        if not self.chat_template:
            raise ValueError(f"tokenizer from {self.source} has no chat template; pass plain text instead")
        if self._compiled is None:
            self._compiled = _compile_template(self.chat_template)
        variables = {k: v for k, v in self.special_tokens.items() if v is not None}
        variables.update(kwargs)
        return self._compiled.render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)

    @classmethod
    def from_folder(cls, folder: Union[str, Path]) -> "Tokenizer":
        """Load tokenizer.json (+ tokenizer_config.json, chat_template.jinja, generation_config.json) from `folder`."""
        from tokenizers import Tokenizer as HFTokenizer

        folder = Path(folder)
        tj = folder / "tokenizer.json"
        if not tj.is_file():
            raise ModelLoadError(f"missing tokenizer file {tj}")
        try:
            backend = HFTokenizer.from_file(str(tj))
        except Exception as e:
            raise ModelLoadError(f"cannot read tokenizer file {tj}: {str(e).splitlines()[0] if str(e) else e}") from None
        tcfg = _read_json(folder / "tokenizer_config.json")
        template = tcfg.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        jinja_file = folder / "chat_template.jinja"
        if template is None and jinja_file.is_file():
            template = jinja_file.read_text()
        special = {k: _token_str(tcfg.get(k)) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
        vocab = backend.get_vocab(with_added_tokens=True)
        stops: set[int] = set()
        for cfg_name in ("config.json", "generation_config.json"):
            stops |= _as_id_set(_read_json(folder / cfg_name).get("eos_token_id"))
        if special["eos_token"] in vocab:
            stops.add(vocab[special["eos_token"]])
        stops |= {vocab[t] for t in KNOWN_STOP_TOKENS if t in vocab}
        vocab_size = tcfg.get("minitorch_vocab_size", backend.get_vocab_size(with_added_tokens=True))
        return cls(backend, template, special, stops, vocab_size, source=str(folder))


def _compile_template(template: str) -> Any:
    """A jinja2 template compiled like transformers' `_compile_jinja_template`."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"malformed JSON in {path}: {e}") from None


def _token_str(v: Any) -> Optional[str]:
    """tokenizer_config special token entries are a string or {"content": ...}."""
    if isinstance(v, dict):
        return v.get("content")
    return v


def _as_id_set(v: Any) -> set[int]:
    if v is None:
        return set()
    if isinstance(v, int):
        return {v}
    return {int(i) for i in v}


def tokenizer_files_from_gguf(reader: Any, out_dir: Union[str, Path]) -> None:
    """Write tokenizer.json and tokenizer_config.json for the tokenizer that GGUF `reader` describes."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    from .gguf_io import field_value

    out_dir = Path(out_dir)
    path = getattr(reader, "data", None)
    path = getattr(path, "filename", "") or "GGUF file"
    kind = field_value(reader, "tokenizer.ggml.model")
    pre = field_value(reader, "tokenizer.ggml.pre")
    if kind != "gpt2":
        raise ModelLoadError(f"{path}: tokenizer model {kind!r} is not supported (byte-level BPE 'gpt2' only)")
    if pre not in GGUF_PRE_TOKENIZERS:
        raise ModelLoadError(f"{path}: pre-tokenizer {pre!r} is not supported ({', '.join(GGUF_PRE_TOKENIZERS)})")
    tokens = list(field_value(reader, "tokenizer.ggml.tokens", []))
    types = list(field_value(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = list(field_value(reader, "tokenizer.ggml.merges", []))
    if not tokens or not merges:
        raise ModelLoadError(f"{path}: GGUF metadata lacks tokenizer.ggml.tokens or tokenizer.ggml.merges")

    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {
        (t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))): i for i, t in enumerate(tokens)
    }
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges], dropout=None, unk_token=None,
                     continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False, byte_fallback=False)
    tk = HFTokenizer(bpe)
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(GGUF_PRE_TOKENIZERS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tk.decoder = decoders.ByteLevel()
    control = [t for t, ty in zip(tokens, types) if ty == _CONTROL and set(t) <= alphabet]
    tk.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    user = [t for t, ty in zip(tokens, types) if ty == _USER_DEFINED and t in vocab]
    tk.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])
    tk.save(str(out_dir / "tokenizer.json"))

    real_size = len(tokens)
    while real_size > 0 and types[real_size - 1] == _UNUSED:  # trailing [PAD...] rows pad the embedding
        real_size -= 1

    def tok_name(key: str) -> Optional[str]:
        i = field_value(reader, f"tokenizer.ggml.{key}")
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    tcfg = {
        "chat_template": field_value(reader, "tokenizer.chat_template"),
        "bos_token": tok_name("bos_token_id"),
        "eos_token": tok_name("eos_token_id"),
        "pad_token": tok_name("padding_token_id"),
        "unk_token": tok_name("unknown_token_id"),
        "minitorch_vocab_size": real_size,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2, ensure_ascii=False))


def load_tokenizer(source: Union[str, Path], cache_dir: Optional[Union[str, Path]] = None, progress: bool = True) -> Tokenizer:
    """Tokenizer for a model folder, a GGUF file (converted once, cached) or a registry name."""
    import os
    import shutil

    from .gguf_io import cache_key, dequant_cache_dir, open_gguf
    from .registry import cache_root, resolve

    path = resolve(source, cache_dir, progress)
    if path.is_dir():
        return Tokenizer.from_folder(path)
    full = dequant_cache_dir(path, cache_dir)  # written by a model load, with the weights
    if (full / "tokenizer.json").is_file():
        tok = Tokenizer.from_folder(full)
    else:  # tokenizer only: convert the metadata, no dequantization
        out = cache_root(cache_dir) / "tokenizers" / cache_key(path)
        if not (out / "tokenizer_config.json").is_file():
            tmp = out.with_name(out.name + f".tmp{os.getpid()}")
            tmp.mkdir(parents=True, exist_ok=True)
            try:
                tokenizer_files_from_gguf(open_gguf(path), tmp)
                if not (out / "tokenizer_config.json").is_file():
                    shutil.rmtree(out, ignore_errors=True)
                    os.replace(tmp, out)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        tok = Tokenizer.from_folder(out)
    tok.source = str(path)
    return tok


def check_compatible(draft: Tokenizer, target: Tokenizer) -> None:
    """Refuse a draft/target pair whose token tables differ over their shared vocabulary."""
    n = min(draft.vocab_size, target.vocab_size)
    a, b = draft.token_table(), target.token_table()
    for i in range(n):
        if a[i] != b[i]:
            raise IncompatibleModelsError(
                f"draft and target tokenizers differ at token id {i} ({a[i]!r} in {draft.source} vs {b[i]!r} in "
                f"{target.source}); speculative decoding needs the same vocabulary"
            )
