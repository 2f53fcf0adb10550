"""minitorch/generation/engine.py: one call for generation whichever engine holds the target. Against the engines'
own functions called directly (the reference), for every drafter kind; the drafter object each backend gets; the
spec's checks; and docs/ARCHITECTURE.md's plain-script example, run on small random models."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from minitorch.generation import (ExtendedDrafter, ModelDrafter, NGramDrafter, SamplingConfig, generate,
                                  speculative_generate)
from minitorch.generation.engine import DrafterSpec, Engine, drafter_for, make_engine, on_graphs
from test_generation_fakes import FakeModel

ROOT = Path(__file__).resolve().parents[1]
V = 40
PROMPT = [3, 7, 7, 9, 3, 7, 7, 9, 3, 7]


@pytest.fixture
def pair():
    target = FakeModel(V, seed=1)
    return target, FakeModel(V, seed=2, like=target, noise=0.2)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("kind", ["none", "model", "ngram", "model+extend", "model+vocab"])
def test_engine_equals_the_engine_functions_called_directly(pair, kind, temperature):
    """Each kind gives the tokens and statistics of speculative_generate / generate with the drafter the
    project used to build by hand (ExtendedDrafter for extend, ModelDrafter(head_vocab) for propose_vocab)."""
    target, draft = pair
    cfg = SamplingConfig(temperature=temperature, seed=3)
    base, extra = kind.split("+") if "+" in kind else (kind, "")
    spec = DrafterSpec(base, model=draft if base == "model" else None, gamma=3, extend=2 if extra == "extend" else 0,
                       propose_vocab=20 if extra == "vocab" else 0)
    got = make_engine(target, spec, cfg, stop_ids={0}).generate(PROMPT, 30, seed=11)
    run_cfg = SamplingConfig(temperature=temperature, seed=11)
    if base == "none":
        ref = generate(target, PROMPT, 30, run_cfg, {0}, vocab_size=V)
    else:
        drafter = NGramDrafter() if base == "ngram" else ModelDrafter(draft, V, head_vocab=20 if extra == "vocab" else None)
        if extra == "extend":
            drafter = ExtendedDrafter(drafter, 3)
        ref = speculative_generate(target, drafter, PROMPT, 30, run_cfg, {0}, gamma=spec.round_gamma, vocab_size=V)
    assert got.tokens == ref.tokens and len(got.tokens) > 0
    for k in ("drafted", "accepted", "rounds", "draft_forwards", "target_forwards"):
        assert got.stats.get(k) == ref.stats.get(k), k


def test_greedy_speculation_equals_the_target_alone(pair):
    target, draft = pair
    engine = make_engine(target, DrafterSpec("model", model=draft, gamma=4))
    spec, alone = engine.generate(PROMPT, 40), engine.alone().generate(PROMPT, 40)
    assert spec.tokens == alone.tokens and spec.stats["rounds"] < 40


def test_vocab_is_the_shared_one_and_alone_keeps_it(pair):
    target, _ = pair
    small = FakeModel(V - 5, seed=2)
    engine = make_engine(target, DrafterSpec("model", model=small), vocab_size=V + 10)
    assert engine.vocab_size == V - 5 and engine.alone().vocab_size == V - 5
    assert engine.alone(small).target is small and engine.alone().spec.kind == "none"


def test_warm_up_runs_every_path(pair, monkeypatch):
    """warm_up generates with the target alone, the draft alone and speculatively before any timing."""
    target, draft = pair
    engine = make_engine(target, DrafterSpec("model", model=draft, gamma=2))
    seen = []
    real = Engine.generate

    def record(self, prompt_ids, max_new_tokens, seed=None, on_tokens=None):
        seen.append((self.target, self.spec.kind, len(prompt_ids)))
        return real(self, prompt_ids, max_new_tokens, seed, on_tokens)

    monkeypatch.setattr(Engine, "generate", record)
    assert engine.warm_up([5, 6]) >= 0
    assert {(t is target, t is draft, k) for t, k, _ in seen} == {
        (True, False, "none"), (False, True, "none"), (True, False, "model")}
    assert all(n == 128 for *_, n in seen)  # WARM_PROMPT_TOKENS: the prompt repeated


def test_each_backend_gets_its_drafter_object(pair):
    """The CPU engine's drafters, and on a CUDA-graph target (a stand-in: graph_decoder) the GPU protocol's."""
    from minitorch.generation.cuda import DecoderDrafter, HeadGpuDrafter
    from minitorch.generation.head_drafter import HeadDrafter

    target, draft = pair
    assert isinstance(drafter_for(DrafterSpec("model", model=draft, gamma=3, extend=2), target, V), ExtendedDrafter)
    assert isinstance(drafter_for(DrafterSpec("ngram"), target, V), NGramDrafter)
    fake_head = SimpleNamespace(config=SimpleNamespace(hidden_size=4))
    cpu_target = SimpleNamespace(config=SimpleNamespace(vocab_size=V), lm_head_weight=lambda: None,
                                 model=SimpleNamespace(embed_tokens=None))
    assert isinstance(drafter_for(DrafterSpec("head", head=fake_head), cpu_target, V), HeadDrafter)
    h = drafter_for(DrafterSpec("head", head=fake_head, lookup=2, lookup_min_prompt=256), cpu_target, V)
    assert (h.lookup, h.lookup_min_prompt) == (2, 256)
    from project.cli_common import Models  # the CLI's engine: the settings' lookup and its shortest prompt
    from project.settings import Settings

    for lookup, least in ((2, 256), (2, 0), (0, 0)):
        m = Models(settings=Settings(drafter="head", gamma=3, extend=0, lookup=lookup, lookup_min_prompt=least),
                   target=cpu_target, tokenizer=None, vocab_size=V, stop_ids=set(), load_seconds=0, head=fake_head)
        assert (m.engine().drafter.lookup, m.engine().drafter.lookup_min_prompt) == (lookup, least)
    with pytest.raises(ValueError, match="CUDA-graph engine only"):  # a CPU verify row is dear: not priced yet
        drafter_for(DrafterSpec("head", head=fake_head, extend=2), cpu_target, V)
    gpu = SimpleNamespace(graph_decoder=True, V=V)
    gpu_draft = SimpleNamespace(graph_decoder=True, V=V)
    assert on_graphs(gpu) and not on_graphs(target)
    d = drafter_for(DrafterSpec("model", model=gpu_draft, gamma=3, extend=4, propose_vocab=9), gpu, V)
    assert isinstance(d, DecoderDrafter) and (d.device, d.lookup_steps, d.propose_vocab) == (gpu_draft, 3, 9)
    h = drafter_for(DrafterSpec("head", head=fake_head), gpu, V)
    assert isinstance(h, HeadGpuDrafter) and h.lookup_steps is None
    h = drafter_for(DrafterSpec("head", head=fake_head, gamma=2, extend=3), gpu, V)
    assert h.lookup_steps == 2 and DrafterSpec("head", head=fake_head, gamma=2, extend=3).round_gamma == 5
    with pytest.raises(ValueError, match="same engine"):
        drafter_for(DrafterSpec("model", model=draft), gpu, V)
    with pytest.raises(ValueError, match="lookup_min_prompt"):  # the CUDA-graph engine looks up in every prompt
        drafter_for(DrafterSpec("head", head=fake_head, lookup=2, lookup_min_prompt=256), gpu, V)


@pytest.mark.parametrize("kw, message", [
    (dict(kind="tree"), "drafter kind"), (dict(kind="model"), "needs its draft model"),
    (dict(kind="head"), "needs its draft head"), (dict(kind="ngram", extend=2), "kind 'model' or 'head'"),
    (dict(kind="ngram", gamma=0), "gamma"), (dict(kind="none", propose_vocab=-1), "propose_vocab"),
    (dict(kind="ngram", lookup_min_prompt=8), "needs lookup"),
])
def test_bad_specs_are_one_clear_error(kw, message):
    with pytest.raises(ValueError, match=message):
        DrafterSpec(**kw)


def test_architecture_example_runs_from_a_plain_script(tmp_path, monkeypatch):
    """The example in docs/ARCHITECTURE.md, as a user would paste it, on small random Qwen2 folders saved with
    transformers instead of the default pair's registry names."""
    pytest.importorskip("torch")
    from test_models_util import hf_qwen2, save_hf, tiny_bpe

    save_hf(hf_qwen2(seed=0), tmp_path / "target", tiny_bpe())
    save_hf(hf_qwen2(seed=1, hidden_size=32, intermediate_size=48, num_hidden_layers=1), tmp_path / "draft",
            tiny_bpe())
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    block = re.search(r"From a plain\s+script.*?```python\n(.*?)```", text, re.S).group(1)
    assert "make_engine(" in block and "engine.generate(" in block
    code = block.replace('"qwen2.5-coder-1.5b-instruct"', repr(str(tmp_path / "target"))).replace(
        '"qwen2.5-coder-0.5b-instruct"', repr(str(tmp_path / "draft")))
    assert code != block
    exec(compile(code, "ARCHITECTURE.md", "exec"), {})  # its own assert: speculative == target alone


def test_a_drafter_that_drops_a_setting_is_caught(pair, monkeypatch):
    """Power of the comparison above: an engine whose drafter ignores --draft-extend's lookup (the model's tokens
    only) gives other statistics than the hand-built ExtendedDrafter, so the test would fail."""
    from minitorch.generation import engine as engine_mod

    target, draft = pair
    real = engine_mod.drafter_for
    monkeypatch.setattr(engine_mod, "drafter_for",
                        lambda spec, t, v: real(DrafterSpec("model", model=spec.model, gamma=spec.round_gamma), t, v))
    spec = DrafterSpec("model", model=draft, gamma=3, extend=2)
    got = make_engine(target, spec).generate(PROMPT, 30)
    ref = speculative_generate(target, ExtendedDrafter(ModelDrafter(draft, V), 3), PROMPT, 30, SamplingConfig(),
                               gamma=5, vocab_size=V)
    assert got.tokens == ref.tokens  # greedy: lossless either way
    assert got.stats["draft_forwards"] != ref.stats["draft_forwards"]
