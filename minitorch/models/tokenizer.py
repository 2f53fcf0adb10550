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
from .gguf_io import (GGUF_PRE_TOKENIZERS, QWEN2_SPLIT, cache_key, dequant_cache_dir, open_gguf,  # noqa: F401
                      tokenizer_files_from_gguf)  # (re-exported: tokenizer_files_from_gguf, the split)

# End-of-turn / end-of-text tokens that stop generation whenever the vocabulary has them.
KNOWN_STOP_TOKENS = ("<|im_end|>", "<|endoftext|>", "<｜end▁of▁sentence｜>", "<|EOT|>", "<|eot_id|>", "<|end_of_text|>")


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



def load_tokenizer(source: Union[str, Path], cache_dir: Optional[Union[str, Path]] = None, progress: bool = True) -> Tokenizer:
    """Tokenizer for a model folder, a GGUF file (converted once, cached) or a registry name."""
    import os
    import shutil

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
