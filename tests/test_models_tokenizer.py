"""Tokenizer + chat template tests: ours (tokenizers + jinja2) against transformers' tokenizer of the same
file or folder (the oracle) on GSM8K text: identical ids, identical decoded text, identical chat strings."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from minitorch.models.errors import IncompatibleModelsError, ModelLoadError
from minitorch.models.gguf_io import open_gguf
from minitorch.models.tokenizer import Tokenizer, check_compatible, tokenizer_files_from_gguf
from test_models_util import QWEN_TEMPLATE, R1_TEMPLATE, gsm8k_texts, hf_qwen2, tiny_bpe, write_gguf

transformers = pytest.importorskip("transformers")

R1_SPECIALS = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>")
CHATS = [
    [{"role": "user", "content": "Natalia sold clips to 48 of her friends. How many?"}],
    [{"role": "system", "content": "Reason step by step."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "<think>\nadd\n</think>\n4"}, {"role": "user", "content": "and 3+3?"}],
]


def _compare(ours: Tokenizer, ref, texts: list[str]) -> None:
    for s in texts:
        ids = ours.encode(s)
        assert ids == ref.encode(s, add_special_tokens=False), s[:60]
        assert ours.decode(ids) == ref.decode(ids)
    for chat in CHATS:
        for gen in (True, False):
            assert ours.apply_chat_template(chat, add_generation_prompt=gen) == ref.apply_chat_template(
                chat, tokenize=False, add_generation_prompt=gen)


def test_gguf_tokenizer_matches_transformers(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "tiny.gguf", hf_qwen2(vocab_size=420), tiny_bpe())
    tokenizer_files_from_gguf(open_gguf(path), tmp_path)
    ours = Tokenizer.from_folder(tmp_path)
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="tiny.gguf")
    texts = gsm8k_texts(200) + ["<|im_start|>user\nhi<|im_end|>\n", "  spaces\t\ttabs\n\n\nnewlines", "naïve café 数学 😀"]
    _compare(ours, ref, texts)
    assert ours.vocab_size == 403  # trailing [PAD] rows of the embedding are not tokens
    assert ours.stop_token_ids == {ours.encode("<|im_end|>")[0], ours.encode("<|endoftext|>")[0]}


def test_load_tokenizer_from_gguf_without_dequantizing(tmp_path: Path) -> None:
    from minitorch.models import load_tokenizer

    path = write_gguf(tmp_path / "tiny.gguf", hf_qwen2(), tiny_bpe())
    tok = load_tokenizer(path, cache_dir=tmp_path / "cache", progress=False)
    assert tok.encode("<|im_end|>") == [402] and tok.source == str(path)
    assert not (tmp_path / "cache" / "dequant").exists()  # no weights were touched
    assert load_tokenizer(path, cache_dir=tmp_path / "cache", progress=False).vocab_size == 403  # cached


def test_folder_tokenizer_matches_transformers_qwen(tmp_path: Path) -> None:
    tk = tiny_bpe()
    tk.save(str(tmp_path / "tokenizer.json"))
    cfg = {"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
           "bos_token": None, "chat_template": QWEN_TEMPLATE}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [402, 400]}))
    ours = Tokenizer.from_folder(tmp_path)
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    _compare(ours, ref, gsm8k_texts(200))
    assert ours.stop_token_ids == {400, 402}  # <|endoftext|>, <|im_end|>


def test_folder_tokenizer_r1_template(tmp_path: Path) -> None:
    tk = tiny_bpe(specials=R1_SPECIALS)
    tk.save(str(tmp_path / "tokenizer.json"))
    cfg = {"tokenizer_class": "LlamaTokenizerFast", "bos_token": {"content": R1_SPECIALS[0], "__type": "AddedToken"},
           "eos_token": R1_SPECIALS[1], "chat_template": R1_TEMPLATE}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    ours = Tokenizer.from_folder(tmp_path)
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    _compare(ours, ref, gsm8k_texts(50))
    text = ours.apply_chat_template(CHATS[1])
    assert text.startswith(R1_SPECIALS[0] + "Reason step by step.<｜User｜>2+2?") and text.endswith("<｜Assistant｜><think>\n")
    assert ours.stop_token_ids == {ours.encode(R1_SPECIALS[1])[0]}


def test_chat_template_file_and_missing(tmp_path: Path) -> None:
    tiny_bpe().save(str(tmp_path / "tokenizer.json"))
    ours = Tokenizer.from_folder(tmp_path)
    with pytest.raises(ValueError, match="no chat template"):
        ours.apply_chat_template(CHATS[0])
    (tmp_path / "chat_template.jinja").write_text(QWEN_TEMPLATE)
    assert Tokenizer.from_folder(tmp_path).apply_chat_template(CHATS[0]).endswith("<|im_start|>assistant\n")


def test_tokenizer_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="missing tokenizer file .*tokenizer.json"):
        Tokenizer.from_folder(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{broken")
    with pytest.raises(ModelLoadError, match="cannot read tokenizer file .*tokenizer.json"):
        Tokenizer.from_folder(tmp_path)


def test_check_compatible(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d, specials in ((a, ("<|endoftext|>", "<|im_start|>", "<|im_end|>")), (b, R1_SPECIALS)):
        d.mkdir()
        tiny_bpe(specials=specials).save(str(d / "tokenizer.json"))
    ta, tb = Tokenizer.from_folder(a), Tokenizer.from_folder(a)
    check_compatible(ta, tb)  # same table: fine
    with pytest.raises(IncompatibleModelsError, match="differ at token id 400"):
        check_compatible(ta, Tokenizer.from_folder(b))


@pytest.mark.real_weights
@pytest.mark.slow
def test_real_draft_gguf_tokenizer_matches_transformers(tmp_path: Path) -> None:
    from minitorch.models.registry import resolve

    path = resolve("qwen2.5-coder-0.5b-instruct", progress=False)
    tokenizer_files_from_gguf(open_gguf(path), tmp_path)
    ours = Tokenizer.from_folder(tmp_path)
    ref = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    _compare(ours, ref, gsm8k_texts(300))
    assert ours.vocab_size == 151665 and ours.stop_token_ids == {151643, 151645}
    assert os.path.getsize(tmp_path / "tokenizer.json") > 1_000_000
