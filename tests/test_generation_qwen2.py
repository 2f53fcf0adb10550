"""Speculative decoding on MiniTorch Qwen2 models: small random models here (saved with transformers,
loaded by our loader), the real offline pair under the real_weights marker.

Greedy speculative output must equal greedy autoregressive output of the target token for token,
and after a run both KV caches must equal the caches of a fresh forward over the final tokens.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from minitorch.generation import ModelDrafter, NGramDrafter, generate, speculative_generate

torch = pytest.importorskip("torch")
from test_models_util import GSM8K, hf_qwen2, save_hf, tiny_bpe  # noqa: E402


def _noisy_copy(model, seed: int, scale: float):
    """A draft close to the target: the same weights plus small noise (high acceptance)."""
    draft = hf_qwen2(seed=0)
    draft.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return draft


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(target, tokenizer, close draft, small different-shape draft, transformers target)."""
    from minitorch.models import load_model

    root = tmp_path_factory.mktemp("qwen2_pair")
    tok = tiny_bpe()
    hf_target = hf_qwen2(seed=0)
    save_hf(hf_target, root / "target", tok)
    save_hf(_noisy_copy(hf_target, 1, 0.002), root / "close", tok)
    save_hf(hf_qwen2(seed=5, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1), root / "small", tok)
    target, our_tok = load_model(root / "target", progress=False)
    close, _ = load_model(root / "close", progress=False)
    small, _ = load_model(root / "small", progress=False)
    return target, our_tok, close, small, hf_target


def _prompts(tok) -> list[list[int]]:
    with open(GSM8K) as f:
        questions = [json.loads(next(f))["question"] for _ in range(2)]
    return [tok.encode(questions[0])[:40], tok.encode(questions[1])[:12], [5]]


def test_greedy_target_matches_transformers(pair):
    target, tok, _, _, hf_target = pair
    prompt = _prompts(tok)[0]
    ours = generate(target, prompt, 24).tokens
    with torch.no_grad():
        ref = hf_target.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
    assert ours == ref[0, len(prompt):].tolist()


@pytest.mark.parametrize("drafter_kind", ["close", "small", "ngram"])
def test_greedy_speculative_equals_target(pair, drafter_kind):
    target, tok, close, small, _ = pair
    for prompt in _prompts(tok):
        ref = generate(target, prompt, 32).tokens
        for gamma in (1, 3, 5):
            drafter = NGramDrafter() if drafter_kind == "ngram" else ModelDrafter(
                close if drafter_kind == "close" else small)
            res = speculative_generate(target, drafter, prompt, 32, gamma=gamma)
            assert res.tokens == ref, (drafter_kind, gamma, len(prompt))
            if drafter_kind == "close":
                assert res.stats["alpha"] > 0.3  # the rollback path is exercised on long runs


def _cache_arrays(cache, n: int) -> list[np.ndarray]:
    return [np.array(t.to_numpy()[:, :, :n]) for t in (*cache.keys, *cache.values)]


def _assert_cache_matches_fresh(model, cache, ids: list[int]) -> None:
    from minitorch import no_grad

    fresh = model.new_cache(len(ids))
    with no_grad():
        model(ids, fresh)
    assert cache.length == len(ids)
    for got, want in zip(_cache_arrays(cache, len(ids)), _cache_arrays(fresh, len(ids))):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rollback_caches_equal_a_fresh_forward(pair, temperature):
    from minitorch.generation import SamplingConfig

    target, tok, close, small, _ = pair
    prompt = _prompts(tok)[1]
    cache = target.new_cache(len(prompt) + 30)
    draft = close if temperature == 0.0 else small  # (sampling: the close draft is never rejected)
    drafter = ModelDrafter(draft)
    res = speculative_generate(target, drafter, prompt, 30, SamplingConfig(temperature=temperature, seed=1),
                               gamma=4, cache=cache)
    final = prompt + res.tokens
    assert res.stats["drafted"] > res.stats["accepted"] > 0  # both accepts and rejections happened
    _assert_cache_matches_fresh(target, cache, final[:-1])
    n = drafter.cache.length
    assert len(final) - 2 <= n <= len(final) - 1
    _assert_cache_matches_fresh(draft, drafter.cache, final[:n])


@pytest.mark.real_weights
@pytest.mark.slow
def test_real_pair_greedy_speculative_equals_target():
    """The offline default pair, 128 greedy tokens on a GSM8K prompt (chat template)."""
    from minitorch.models import DEFAULT_DRAFT, DEFAULT_TARGET, check_compatible, load_model

    target, tok = load_model(DEFAULT_TARGET, progress=False)
    draft, dtok = load_model(DEFAULT_DRAFT, progress=False)
    check_compatible(dtok, tok)
    with open(GSM8K) as f:
        question = json.loads(next(f))["question"]
    text = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    prompt = tok.encode(text)
    vocab = min(tok.vocab_size, target.config.vocab_size, draft.config.vocab_size)
    ref = generate(target, prompt, 128, vocab_size=vocab)  # no stop tokens: all 128 tokens compared
    res = speculative_generate(target, ModelDrafter(draft), prompt, 128, gamma=4, vocab_size=vocab)
    assert len(ref.tokens) == 128
    assert res.tokens == ref.tokens
    assert res.stats["alpha"] > 0.3
