"""Qwen2 on MiniTorch against transformers (float32 oracle): random configurations saved with
save_pretrained (safetensors) and as GGUF, logits over a prompt and every decode step, cached ==
uncached, rollback + re-decode == fresh, and the gradient through one decoder layer vs torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import minitorch
from minitorch import FastBackend, SimpleBackend
from minitorch.models import Qwen2ForCausalLM, load_model
from minitorch.models.errors import ModelLoadError
from test_models_util import hf_qwen2, save_hf, tiny_bpe, write_gguf

torch = pytest.importorskip("torch")

ATOL = 1e-4
# (overrides, why): GQA ratios 1/2/4/7, MHA, tied/untied, odd sizes, rope thetas
CONFIGS = [
    dict(),
    dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True, rope_theta=1e6),
    dict(hidden_size=56, num_attention_heads=7, num_key_value_heads=1, intermediate_size=73, rope_theta=500.0),
    dict(hidden_size=48, num_attention_heads=8, num_key_value_heads=2, intermediate_size=40, num_hidden_layers=3,
         tie_word_embeddings=True, vocab_size=421),
]


def _prompt(n: int, vocab: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, size=n).tolist()


def _hf_logits(m: Any, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].numpy()  # (T, V)


def _ours(model: Qwen2ForCausalLM, ids: list[int], cache: Any = None) -> np.ndarray:
    with minitorch.no_grad():
        return np.array(model(ids, cache).to_numpy()[0])  # (T, V)


@pytest.fixture(scope="module", params=range(len(CONFIGS)))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Qwen2ForCausalLM]:
    hf = hf_qwen2(seed=request.param, **CONFIGS[request.param])
    folder = save_hf(hf, tmp_path_factory.mktemp(f"qwen{request.param}"), tiny_bpe())
    ours, tok = load_model(str(folder), backend=FastBackend, progress=False)
    assert tok.vocab_size == 403
    return hf, ours


def test_prompt_and_every_decode_step_match_transformers(pair: tuple[Any, Qwen2ForCausalLM]) -> None:
    hf, ours = pair
    ids = _prompt(11, hf.config.vocab_size)
    cache = ours.new_cache(64)
    np.testing.assert_allclose(_ours(ours, ids, cache), _hf_logits(hf, ids), atol=ATOL, rtol=0)
    seq = list(ids)
    for step in range(8):  # greedy decode one token at a time, compare the last position each step
        nxt = int(_hf_logits(hf, seq)[-1].argmax())
        seq.append(nxt)
        got = _ours(ours, [nxt], cache)
        np.testing.assert_allclose(got[0], _hf_logits(hf, seq)[-1], atol=ATOL, rtol=0, err_msg=f"step {step}")
    assert cache.length == len(seq)


def test_cached_equals_uncached_and_multi_token_verify(pair: tuple[Any, Qwen2ForCausalLM]) -> None:
    _, ours = pair
    ids = _prompt(15, ours.config.vocab_size, seed=1)
    full = _ours(ours, ids)  # no cache: one pass over everything
    cache = ours.new_cache(32)
    parts = [_ours(ours, ids[:6], cache), _ours(ours, ids[6:7], cache), _ours(ours, ids[7:12], cache), _ours(ours, ids[12:], cache)]
    np.testing.assert_allclose(np.concatenate(parts), full, atol=1e-5, rtol=0)


def test_verify_pass_equals_decode_steps_bit_for_bit(pair: tuple[Any, Qwen2ForCausalLM]) -> None:
    """gamma+1 tokens scored in one pass give exactly the logits of gamma+1 one-token steps (same cache):
    every op treats rows alike, so greedy speculative decoding equals greedy decoding without near-tie luck."""
    _, ours = pair
    ids = _prompt(10, ours.config.vocab_size, seed=5)
    cache = ours.new_cache(32)
    toks = [int(_ours(ours, ids, cache)[-1].argmax())]
    start, steps = cache.length, []
    for _ in range(5):
        steps.append(_ours(ours, [toks[-1]], cache)[-1])
        toks.append(int(steps[-1].argmax()))
    cache.truncate(start)
    verify = _ours(ours, toks[:5], cache)
    assert np.array_equal(verify, np.stack(steps))


def test_head_rows_are_the_first_rows_of_the_full_logits(pair: tuple[Any, Qwen2ForCausalLM]) -> None:
    _, ours = pair
    ids = _prompt(6, ours.config.vocab_size, seed=4)
    full = _ours(ours, ids)
    with minitorch.no_grad():
        part = ours(ids, head_rows=50).to_numpy()[0]
        with pytest.raises(ValueError, match="head_rows must be in"):
            ours(ids, head_rows=ours.config.vocab_size + 1)
    assert part.shape == (6, 50)
    np.testing.assert_allclose(part, full[:, :50], atol=1e-5, rtol=0)


def test_last_n_logits(pair: tuple[Any, Qwen2ForCausalLM]) -> None:
    _, ours = pair
    ids = _prompt(7, ours.config.vocab_size, seed=9)
    full = _ours(ours, ids)
    with minitorch.no_grad():
        cache = ours.new_cache(16)
        last = ours(ids, cache, last_n=2).to_numpy()[0]
        assert cache.length == 7
    np.testing.assert_allclose(last, full[-2:], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="last_n must be in"):
        ours(ids, last_n=0)


def test_rollback_then_redecode_equals_fresh(pair: tuple[Any, Qwen2ForCausalLM]) -> None:
    _, ours = pair
    v = ours.config.vocab_size
    prompt, rejected, accepted = _prompt(9, v, 2), _prompt(5, v, 3), _prompt(4, v, 4)
    cache = ours.new_cache(32)
    _ours(ours, prompt, cache)
    _ours(ours, rejected, cache)  # a speculative block that gets rejected
    cache.truncate(len(prompt) + 1)  # keep one accepted token
    after = _ours(ours, accepted, cache)
    fresh = _ours(ours, prompt + rejected[:1] + accepted)[-len(accepted):]
    np.testing.assert_allclose(after, fresh, atol=1e-5, rtol=0)


def test_gguf_file_matches_transformers_own_gguf_load(tmp_path: Path) -> None:
    """Same GGUF file into transformers (its GGUF loader) and into ours: equal logits (layout check)."""
    hf = hf_qwen2(seed=7, num_attention_heads=8, num_key_value_heads=2, hidden_size=64, tie_word_embeddings=False)
    path = write_gguf(tmp_path / "tiny.gguf", hf, tiny_bpe(), qtype="Q8_0")
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="tiny.gguf", dtype=torch.float32).eval()
    ours, _ = load_model(path, backend=FastBackend, progress=False, cache_dir=tmp_path / "cache")
    ids = _prompt(12, hf.config.vocab_size, seed=5)
    np.testing.assert_allclose(_ours(ours, ids, ours.new_cache(16)), _hf_logits(ref, ids), atol=ATOL, rtol=0)


def test_simple_backend_matches_fast(tmp_path: Path) -> None:
    hf = hf_qwen2(seed=3, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=24,
                  num_hidden_layers=1, vocab_size=403)
    folder = save_hf(hf, tmp_path, tiny_bpe())
    slow, _ = load_model(folder, backend=SimpleBackend, progress=False)
    ids = _prompt(5, 403)
    np.testing.assert_allclose(_ours(slow, ids, slow.new_cache(8)), _hf_logits(hf, ids), atol=ATOL, rtol=0)


def test_decoder_layer_gradient_matches_torch() -> None:
    hf = hf_qwen2(seed=11, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=40,
                  num_hidden_layers=1)
    ours = Qwen2ForCausalLM(_cfg_of(hf), FastBackend)
    ours.load_weights({k: v.numpy() for k, v in hf.state_dict().items()})
    layer, ref_layer = ours.model.layers[0], hf.model.layers[0]
    for _, p in layer.named_parameters():
        p.value.requires_grad_(True)
    t = 6
    x_np = np.random.default_rng(0).standard_normal((1, t, 32)).astype(np.float32)
    w_np = np.random.default_rng(1).standard_normal((1, t, 32)).astype(np.float32)
    ours._ensure_rope(t)
    x = minitorch.tensor(x_np.tolist(), backend=FastBackend).requires_grad_(True)
    out = layer(x, ours._cos.narrow(0, 0, t), ours._sin.narrow(0, 0, t))
    (out * minitorch.tensor(w_np.tolist(), backend=FastBackend)).sum().backward()

    xt = torch.tensor(x_np, requires_grad=True)
    pos = torch.arange(t)[None]
    cos, sin = hf.model.rotary_emb(xt, pos)
    mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
    ref_out = ref_layer(xt, attention_mask=mask, position_embeddings=(cos, sin), position_ids=pos)
    ref_out = ref_out[0] if isinstance(ref_out, tuple) else ref_out
    (ref_out * torch.tensor(w_np)).sum().backward()

    np.testing.assert_allclose(out.to_numpy(), ref_out.detach().numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(x.grad.to_numpy(), xt.grad.numpy(), atol=1e-4, rtol=1e-4)
    ref_params = dict(ref_layer.named_parameters())
    for name, p in layer.named_parameters():
        np.testing.assert_allclose(p.value.grad.to_numpy(), ref_params[name].grad.numpy(), atol=1e-4, rtol=1e-4, err_msg=name)


def _cfg_of(hf: Any) -> Any:
    from minitorch.models import Qwen2Config

    return Qwen2Config.from_dict(hf.config.to_dict())


def test_model_errors(tmp_path: Path) -> None:
    hf = hf_qwen2(seed=1)
    folder = save_hf(hf, tmp_path / "m", tiny_bpe())
    ours, _ = load_model(folder, progress=False)
    cache = ours.new_cache(8)
    with pytest.raises(ValueError, match="KV cache full"):
        _ours(ours, list(range(9)), cache)
    with pytest.raises(ValueError, match="cannot truncate"):
        cache.truncate(3)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        ours.new_cache(10_000)
    (folder / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="missing model config .*config.json"):
        load_model(folder, progress=False)
    w = {k: v.numpy() for k, v in hf.state_dict().items() if k != "model.layers.1.mlp.up_proj.weight"}
    with pytest.raises(ModelLoadError, match="lacks weight model.layers.1.mlp.up_proj.weight"):
        Qwen2ForCausalLM(_cfg_of(hf), FastBackend).load_weights(w, source="x")
