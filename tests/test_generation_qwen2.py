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
    # the small draft: the target without its last layer (1 layer of 2, a layer-skip draft), so it agrees with
    # the target on part of the tokens: greedy runs see accepted runs and rejections (an unrelated random draft
    # had acceptance ~0 and exercised only the all-rejected path)
    small = hf_qwen2(seed=5, num_hidden_layers=1)
    small.load_state_dict({k: v for k, v in hf_target.state_dict().items() if not k.startswith("model.layers.1.")})
    save_hf(small, root / "small", tok)
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
            if drafter_kind == "small" and len(prompt) == 40:  # partial acceptance: accepted runs and rejections
                assert 0 < res.stats["accepted"] < res.stats["drafted"] and res.stats["accept_length_hist"][0] > 0


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


# --- the vocabulary cut: a model whose vocabulary is padded past its tokenizer's ------------------------
# The default pair has 151,936 logits for a 151,665-id tokenizer, so every token is chosen among the first
# tokenizer.vocab_size logits. With equal vocabularies (the pair above) the cut does nothing; here the model
# has PAD extra rows, made large so that without the cut (or with a wrong one) the argmax lands there.
PAD = 109


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    """(target, tokenizer, draft, transformers target, shared vocabulary from the CLI loader)."""
    from project import cli_common
    from project.settings import Settings

    root = tmp_path_factory.mktemp("qwen2_padded")
    tok = tiny_bpe()
    n_tok = tok.get_vocab_size()
    hf_t = hf_qwen2(seed=3, vocab_size=n_tok + PAD)
    hf_d = hf_qwen2(seed=3, vocab_size=n_tok + PAD)
    hf_d.load_state_dict(hf_t.state_dict())
    with torch.no_grad():
        hf_t.lm_head.weight[n_tok:] *= 4.0  # padding logits 4x larger: they would win most argmaxes
        gen = torch.Generator().manual_seed(7)
        for p in hf_d.parameters():
            p.add_(0.003 * torch.randn(p.shape, generator=gen))
        hf_d.lm_head.weight[n_tok:] *= 4.0
    save_hf(hf_t, root / "target", tok)
    save_hf(hf_d, root / "draft", tok)
    models = cli_common.load_models(Settings(target=str(root / "target"), draft=str(root / "draft"), drafter="model"),
                                    progress=False)
    return models.target, models.tokenizer, models.draft, hf_t, models.vocab_size


def _hf_greedy_first_n(hf_model, prompt: list[int], n_new: int, n_vocab: int) -> list[int]:
    """transformers as the oracle: full-sequence forwards, argmax over the first n_vocab logits."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n_new):
            logits = hf_model(torch.tensor([ids])).logits[0, -1, :n_vocab]
            ids.append(int(torch.argmax(logits)))
    return ids[len(prompt):]


def _check_vocab_cut(padded) -> None:
    from minitorch.generation import SamplingConfig, logits_to_probs

    target, tok, draft, hf_t, vocab = padded
    n_tok = tok.vocab_size
    assert vocab == n_tok == target.config.vocab_size - PAD  # the CLI loader cuts at the tokenizer
    prompt = tok.encode("Natalia sold clips to 48 of her friends in April")[:16]
    # the padding must matter: transformers' unrestricted argmax picks a padding id here
    with torch.no_grad():
        full = hf_t(torch.tensor([prompt])).logits[0, -1]
    assert int(torch.argmax(full)) >= n_tok
    ref = _hf_greedy_first_n(hf_t, prompt, 12, n_tok)
    assert generate(target, prompt, 12, vocab_size=vocab).tokens == ref
    for drafter in (ModelDrafter(draft, vocab), NGramDrafter()):
        res = speculative_generate(target, drafter, prompt, 12, gamma=3, vocab_size=vocab)
        assert res.tokens == ref
    # sampling: the first token's distribution is softmax over the first n_tok logits
    from minitorch.generation.sampling import logits_rows
    from minitorch import no_grad

    with no_grad():
        rows = logits_rows(target(prompt, target.new_cache(len(prompt))), vocab)
    want = torch.softmax(full[:n_tok].double(), -1).numpy()
    np.testing.assert_allclose(logits_to_probs(rows[-1], SamplingConfig(temperature=1.0)), want, atol=1e-6)


def test_padded_vocabulary_is_cut_to_the_tokenizer_like_transformers(padded):
    _check_vocab_cut(padded)


def test_wrong_vocabulary_cut_is_detected(padded, monkeypatch):
    """The check above fails when logits_rows keeps the last vocab_size columns instead of the first."""
    import minitorch.generation.autoregressive as ar
    import minitorch.generation.drafters as dr
    import minitorch.generation.sampling as sm
    import minitorch.generation.speculative as sp

    real = sm.logits_rows

    def last_columns(logits, vocab_size=None):
        rows = real(logits)
        return rows if vocab_size is None else rows[:, rows.shape[1] - vocab_size:]

    for mod in (ar, dr, sm, sp):
        monkeypatch.setattr(mod, "logits_rows", last_columns)
    with pytest.raises(AssertionError):
        _check_vocab_cut(padded)
