"""The trained draft head (minitorch/models/draft_head.py), its drafter and its training program.

- forward, loss and one training step's gradients against the same head written in torch;
- HeadDrafter: incremental drafting equals the head run over the whole context; greedy speculative decoding with a
  head equals the target alone (trained or not), and its caches follow rollbacks;
- training (project/training): a tiny head trained on a tiny target raises the acceptance rate over the untrained
  head, and the same training with its labels shifted by one position does not; checkpoints resume exactly;
- files and errors: a head for another target, a missing or corrupt head file -> one line, exit 2.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import minitorch
from minitorch.generation import SamplingConfig, generate, speculative_generate
from minitorch.generation.head_drafter import HeadDrafter
from minitorch.models import ModelLoadError, load_model
from minitorch.models.draft_head import DraftHead, DraftHeadConfig, head_loss, load_head, target_fingerprint

torch = pytest.importorskip("torch")
from backends import BACKENDS  # noqa: E402
from test_models_util import hf_qwen2, save_hf, tiny_bpe  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    root = tmp_path_factory.mktemp("head_target")
    save_hf(hf_qwen2(seed=0, max_position_embeddings=1024), root / "t", tiny_bpe())
    model, tok = load_model(root / "t", progress=False)
    return model, tok, root / "t"


def _cfg(model, **kw) -> DraftHeadConfig:
    return DraftHeadConfig.for_target(model, head_vocab=kw.pop("head_vocab", 300), intermediate_size=kw.pop("inter", 48))


# -- the head against torch ------------------------------------------------------------------------

def _torch_head(head: DraftHead, feats, emb, lm):
    """The head written directly in torch (transformers' Qwen2 numerics): returns (g, logits)."""
    P = {n: torch.tensor(np.asarray(p.value.to_numpy()), requires_grad=True) for n, p in head.named_parameters()}
    c = head.config
    x = torch.cat([feats, emb], -1) @ P["fc.weight"].T + P["fc.bias"]

    def rms(v, w):
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps) * w

    b, t, _ = x.shape
    h = rms(x, P["layer.input_layernorm.weight"])
    q = (h @ P["layer.self_attn.q_proj.weight"].T + P["layer.self_attn.q_proj.bias"]).view(b, t, -1, c.head_dim).transpose(1, 2)
    k = (h @ P["layer.self_attn.k_proj.weight"].T + P["layer.self_attn.k_proj.bias"]).view(b, t, -1, c.head_dim).transpose(1, 2)
    v = (h @ P["layer.self_attn.v_proj.weight"].T + P["layer.self_attn.v_proj.bias"]).view(b, t, -1, c.head_dim).transpose(1, 2)
    inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim))
    fr = torch.outer(torch.arange(t, dtype=torch.float32), inv)
    cos, sin = torch.cat([fr, fr], -1).cos(), torch.cat([fr, fr], -1).sin()

    def rot(z):
        z1, z2 = z[..., : c.head_dim // 2], z[..., c.head_dim // 2:]
        return z * cos + torch.cat([-z2, z1], -1) * sin

    q, k = rot(q), rot(k)
    rep = c.num_attention_heads // c.num_key_value_heads
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = (q @ k.transpose(2, 3)) * c.head_dim ** -0.5
    s = s.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
    o = (s.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1) @ P["layer.self_attn.o_proj.weight"].T
    hh = x + o
    m = rms(hh, P["layer.post_attention_layernorm.weight"])
    mlp = (torch.nn.functional.silu(m @ P["layer.mlp.gate_proj.weight"].T) * (m @ P["layer.mlp.up_proj.weight"].T))
    g = hh + mlp @ P["layer.mlp.down_proj.weight"].T
    return g, g @ lm.T, P


@pytest.mark.parametrize("backend", BACKENDS)
def test_head_forward_loss_and_gradients_match_torch(target, backend):
    """Every backend (the CUDA one where a GPU is present: training runs there too)."""
    model, _, _ = target
    head = DraftHead(_cfg(model), backend, seed=3)
    rng = np.random.default_rng(0)
    B, T, D = 2, 7, model.config.hidden_size
    f, e, nf = (rng.standard_normal((B, T, D)).astype(np.float32) for _ in range(3))
    mask = (rng.random((B, T)) < 0.7).astype(np.float32)
    lm = np.asarray(model.lm_head_weight().to_numpy())[:300]
    p = np.exp(nf @ lm.T)
    p /= p.sum(-1, keepdims=True)
    F, E, NF, L, PP, M = (minitorch.from_numpy(a, backend=backend) for a in (f, e, nf, np.ascontiguousarray(lm), p.astype(np.float32), mask))
    g = head(F, E)
    logits = head.logits(g, L, 300)
    loss, feat, ce = head_loss(g, logits, NF, PP, M)
    loss.backward()

    tg, tlogits, P = _torch_head(head, torch.tensor(f), torch.tensor(e), torch.tensor(lm))
    tm = torch.tensor(mask)
    tfeat = (torch.nn.functional.smooth_l1_loss(tg, torch.tensor(nf), reduction="none") * tm[..., None]).sum() / (tm.sum() * D)
    tce = -(torch.tensor(p, dtype=torch.float32) * tlogits.log_softmax(-1) * tm[..., None]).sum() / tm.sum()
    tloss = tfeat + 0.1 * tce
    tloss.backward()
    np.testing.assert_allclose(np.asarray(g.to_numpy()), tg.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(float(feat.item()), float(tfeat), rtol=1e-4)
    np.testing.assert_allclose(float(ce.item()), float(tce), rtol=1e-4)
    for name, par in head.named_parameters():
        np.testing.assert_allclose(np.asarray(par.value.grad.to_numpy()), P[name].grad.numpy(), rtol=2e-3, atol=2e-5,
                                   err_msg=name)


# -- drafting ---------------------------------------------------------------------------------------

def _features(model, ids):
    _, h = model(ids, None, return_hidden=True)
    return np.asarray(h.to_numpy())[0]


def test_incremental_drafts_equal_the_head_over_the_whole_context(target):
    """The drafter's cached head steps (own features for drafted positions) equal running the head from scratch."""
    model, _, _ = target
    head = DraftHead(_cfg(model), model.backend, seed=1)
    ctx = [int(t) for t in np.random.default_rng(1).integers(3, 390, size=30)]
    d = HeadDrafter(head, model)
    d.start(ctx[:12], 64, 400)
    d.observe(_features(model, ctx[:11]))
    d.propose(ctx[:12], 3, SamplingConfig(), np.random.default_rng(0))  # fill, draft, trim
    d.rollback(11)
    d.observe(_features(model, ctx[:20])[11:19])  # as the engine would after accepting ctx[12:20]
    drafts, _ = d.propose(ctx[:20], 3, SamplingConfig(), np.random.default_rng(0))
    # reference: the head over positions 0..18 with the target's features, then its own feature, uncached
    f = _features(model, ctx[:19])
    emb = model.model.embed_tokens
    lm = model.lm_head_weight()
    ref, feats, toks = [], list(f), list(ctx[1:20])
    for _ in range(3):
        g = head(minitorch.from_numpy(np.stack(feats)[None]), emb(minitorch.tensor([toks], dtype="int64")))
        logits = np.asarray(head.logits(g, lm, 300).to_numpy())[0, -1]
        ref.append(int(np.argmax(logits)))
        feats.append(np.asarray(g.to_numpy())[0, -1])
        toks.append(ref[-1])
    assert drafts == ref


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_greedy_and_sampled_speculative_with_a_head_follow_the_target(target, temperature):
    model, tok, _ = target
    prompt = tok.encode("Natalia sold clips to 48 of her friends in April")
    head = DraftHead(_cfg(model), model.backend, seed=2)
    cfg = SamplingConfig(temperature=temperature, seed=5)
    spec = speculative_generate(model, HeadDrafter(head, model), prompt, 40, cfg, gamma=3)
    if temperature == 0.0:
        assert spec.tokens == generate(model, prompt, 40, cfg).tokens
    assert len(spec.tokens) == 40 and spec.stats["rounds"] >= 10


# -- files and errors --------------------------------------------------------------------------------

def test_head_files_round_trip_and_refuse_another_target(target, tmp_path):
    model, _, _ = target
    head = DraftHead(_cfg(model), model.backend, seed=7)
    head.save(tmp_path / "h")
    back = load_head(tmp_path / "h", model)
    for (n, a), (_, b) in zip(head.named_parameters(), back.named_parameters()):
        np.testing.assert_array_equal(np.asarray(a.value.to_numpy()), np.asarray(b.value.to_numpy()), err_msg=n)
    other, _ = load_model(_other_target(tmp_path), progress=False)
    assert target_fingerprint(other) != target_fingerprint(model)
    with pytest.raises(ModelLoadError, match="another target"):
        load_head(tmp_path / "h", other)
    (tmp_path / "h" / "head.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(ModelLoadError):
        load_head(tmp_path / "h", model)


def _other_target(tmp_path):
    save_hf(hf_qwen2(seed=9, max_position_embeddings=1024), tmp_path / "other", tiny_bpe())
    return tmp_path / "other"


def _run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_cli_errors_are_one_line_exit_2(target, tmp_path):
    _, _, path = target
    r = _run("project/run_spec_decoding.py", "--target", str(path), "--drafter", "head", "--head", str(tmp_path / "none"))
    assert r.returncode == 2 and "no draft head" in r.stderr and "Traceback" not in r.stderr
    head = DraftHead(_cfg(load_model(path, progress=False)[0]), minitorch.FastBackend)
    head.config.target_fingerprint = "0" * 16
    head.save(tmp_path / "wrong")
    r = _run("project/run_spec_decoding.py", "--target", str(path), "--drafter", "head", "--head", str(tmp_path / "wrong"))
    assert r.returncode == 2 and "another target" in r.stderr and "Traceback" not in r.stderr
    r = _run("project/train_draft_head.py", "--target", str(path), "--data-file", str(ROOT / "data/gsm8k/test.jsonl"),
             "--output", str(tmp_path / "o"))
    assert r.returncode == 2 and "evaluation set" in r.stderr
    # a one-line answer for the CUDA-graph path too (before any GPU is touched)
    r = _run("project/run_spec_decoding.py", "--target", str(path), "--drafter", "head", "--backend", "cuda")
    assert r.returncode == 2 and "Traceback" not in r.stderr
