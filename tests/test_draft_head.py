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
from minitorch.models.draft_head import DraftHead, DraftHeadConfig, target_fingerprint
from minitorch.models.head_io import load_head, save_head

torch = pytest.importorskip("torch")
from backends import BACKENDS, FAST_BACKENDS  # noqa: E402
from test_models_util import count_calls, hf_qwen2, save_hf, tiny_bpe  # noqa: E402
from project.training import ttt  # noqa: E402
from project.training.objective import head_loss, ttt_loss, ttt_weights  # noqa: E402

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


def test_the_head_reads_the_prompt_in_the_prefill(target, monkeypatch):
    """The prompt's positions go through the head in the engine's prefill (one step over all but the last), so a
    round's first step reads only the positions since the last round: the draft timer, and the draft budget that
    learns a step's cost from it, see a round's work (a first round that read the whole prompt made a 4 ms head
    step look like 33 ms on the CPU, and the budget then never drafted again). A drafter that defers the prompt to
    its first propose is caught."""
    model, tok, _ = target
    prompt = tok.encode("Natalia sold clips to 48 of her friends in April, and then she sold half as many in May")
    head = DraftHead(_cfg(model), model.backend, seed=2)
    steps = []  # (rows, inside propose) of every head step
    step, propose = DraftHead.draft_step, HeadDrafter.propose
    inside = [False]

    def counted(self, feats, *a, **k):
        steps.append((int(feats.shape[1]), inside[0]))
        return step(self, feats, *a, **k)

    def proposing(self, *a, **k):
        inside[0] = True
        try:
            return propose(self, *a, **k)
        finally:
            inside[0] = False

    monkeypatch.setattr(DraftHead, "draft_step", counted)
    monkeypatch.setattr(HeadDrafter, "propose", proposing)

    def round_rows(drafter):
        steps.clear()
        res = speculative_generate(model, drafter, prompt, 20, SamplingConfig(), gamma=3)
        assert res.tokens == generate(model, prompt, 20, SamplingConfig()).tokens
        return [r for r, in_round in steps if in_round], [r for r, in_round in steps if not in_round]

    in_rounds, in_prefill = round_rows(HeadDrafter(head, model))
    assert in_prefill == [len(prompt) - 1] and max(in_rounds) <= 3 + 1  # then a round's new positions at most

    class Deferring(HeadDrafter):  # the broken variant: the prompt is read by the first propose
        def observe(self, feats):
            self._prompt = None
            super().observe(feats)

    in_rounds, _ = round_rows(Deferring(head, model))
    with pytest.raises(AssertionError):
        assert max(in_rounds) <= 3 + 1


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
    save_head(head, tmp_path / "h")
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
    save_head(head, tmp_path / "wrong")
    r = _run("project/run_spec_decoding.py", "--target", str(path), "--drafter", "head", "--head", str(tmp_path / "wrong"))
    assert r.returncode == 2 and "another target" in r.stderr and "Traceback" not in r.stderr
    r = _run("project/train_draft_head.py", "--target", str(path), "--data-file", str(ROOT / "data/gsm8k/test.jsonl"),
             "--output", str(tmp_path / "o"))
    assert r.returncode == 2 and "evaluation set" in r.stderr
    # a one-line answer for the CUDA-graph path too (before any GPU is touched)
    r = _run("project/run_spec_decoding.py", "--target", str(path), "--drafter", "head", "--backend", "cuda")
    assert r.returncode == 2 and "Traceback" not in r.stderr


# -- training-time test (project/training/ttt.py's forward_steps) ------------------------------------------------------

def _tiny_head(backend=minitorch.FastBackend, seed=1) -> DraftHead:
    """A head of its own small shapes (4 query heads over 2 kv heads: GQA), no target needed."""
    cfg = DraftHeadConfig(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=8, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=128,
                          head_vocab=40, target_fingerprint="0" * 16)
    head = DraftHead(cfg, backend, seed=seed)
    rng = np.random.default_rng(seed + 100)
    for name, p in head.named_parameters():  # the biases and norms off their zero / one starts: every weight counts
        if name.endswith("bias") or name.endswith("layernorm.weight"):
            arr = np.asarray(p.value.to_numpy()) + 0.1 * rng.standard_normal(p.value.shape)
            p.update(minitorch.from_numpy(arr.astype(np.float32), backend=backend))
            p.value.requires_grad_(True)
    return head


def _drafting_reference(head, f, e, step, t):
    """The head as HeadDrafter runs it: a KV cache over the verified positions 0..t-step+1 (the target's features),
    then one position at a time reading its own previous output, up to position t. Returns g at t (D,)."""
    be = head.backend
    cache = head.new_cache(64)
    p = t - step + 1
    g = head(minitorch.from_numpy(f[None, :p + 1], backend=be), minitorch.from_numpy(e[None, :p + 1], backend=be), cache)
    last = np.asarray(g.to_numpy())[0, -1]
    for pos in range(p + 1, t + 1):
        g = head(minitorch.from_numpy(last[None, None].copy(), backend=be),
                 minitorch.from_numpy(e[None, pos:pos + 1], backend=be), cache)
        last = np.asarray(g.to_numpy())[0, -1]
    return last


def _steps_vs_drafting(head, steps=4, B=2, T=9, seed=0) -> float:
    """Largest |forward_steps - drafting reference| over every step, batch row and position t >= step-1."""
    rng = np.random.default_rng(seed)
    D = head.config.hidden_size
    f, e = (rng.standard_normal((B, T, D)).astype(np.float32) for _ in range(2))
    gs = ttt.forward_steps(head, minitorch.from_numpy(f), minitorch.from_numpy(e), steps)
    worst = 0.0
    for j, g in enumerate(gs, 1):
        out = np.asarray(g.to_numpy())
        assert np.isfinite(out).all()  # positions t < j-1 too (unscored, but they feed nothing scored)
        for b in range(B):
            for t in range(j - 1, T):
                worst = max(worst, float(np.abs(out[b, t] - _drafting_reference(head, f[b], e[b], j, t)).max()))
    return worst


def test_forward_steps_equal_drafting_with_a_kv_cache():
    """Step j's output at position t is the head's j-th draft after the verified context 0..t-j+1, computed as the
    drafter computes it (a KV cache, one position at a time on its own outputs)."""
    assert _steps_vs_drafting(_tiny_head()) < 1e-5


def test_an_off_by_one_in_the_step_mask_is_caught(monkeypatch):
    """The same check fails when step j may read one step-1 key too many (s <= t-j+2: the key of the position whose
    feature step j is guessing)."""
    head = _tiny_head()
    assert _steps_vs_drafting(head, steps=2) < 1e-5
    real = ttt.ttt_context_mask
    monkeypatch.setattr(ttt, "ttt_context_mask", lambda t, step: real(t, step - 1))
    assert _steps_vs_drafting(head, steps=2) > 1e-3


def test_forward_steps_step_one_is_forward_bit_for_bit():
    """Step 1 of forward_steps runs the layer's own ops: the same g and the same gradients as forward."""
    rng = np.random.default_rng(2)
    f, e = (minitorch.from_numpy(rng.standard_normal((2, 7, 32)).astype(np.float32)) for _ in range(2))
    grads = []
    for run in (lambda h: h(f, e), lambda h: ttt.forward_steps(h, f, e, 1)[0]):
        head = _tiny_head()
        g = run(head)
        (g * g).sum().backward()
        grads.append((np.asarray(g.to_numpy()), {n: np.asarray(p.value.grad.to_numpy()) for n, p in head.named_parameters()}))
    np.testing.assert_array_equal(grads[0][0], grads[1][0])
    for n in grads[0][1]:
        np.testing.assert_array_equal(grads[0][1][n], grads[1][1][n], err_msg=n)


def _torch_steps(P, c, feats, emb, steps):
    """forward_steps written in torch, attention built position by position from the key sets drafting sees:
    step 1's keys 0..t-j+1, then step i's key at t-j+i for i = 2..j."""
    def rms(v, w):
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps) * w

    b, t, _ = feats.shape
    hd, rep = c.head_dim, c.num_attention_heads // c.num_key_value_heads
    inv = 1.0 / (c.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    fr = torch.outer(torch.arange(t, dtype=torch.float32), inv)
    cos, sin = torch.cat([fr, fr], -1).cos(), torch.cat([fr, fr], -1).sin()

    def rot(z):
        return z * cos + torch.cat([-z[..., hd // 2:], z[..., :hd // 2]], -1) * sin

    def proj(h, name):
        a = "layer.self_attn." + name
        return (h @ P[a + ".weight"].T + P[a + ".bias"]).view(b, t, -1, hd).transpose(1, 2)

    gs, ks, vs = [], [], []
    for j in range(1, steps + 1):
        inp = feats if j == 1 else torch.cat([feats[:, :1], gs[-1][:, :-1]], 1)
        x = torch.cat([inp, emb], -1) @ P["fc.weight"].T + P["fc.bias"]
        h = rms(x, P["layer.input_layernorm.weight"])
        q, k, v = rot(proj(h, "q_proj")), rot(proj(h, "k_proj")), proj(h, "v_proj")
        ks.append(k)
        vs.append(v)
        rows = []
        for pos in range(t):
            kk = [ks[0][:, :, :max(pos - j + 2, 0)]] + [ks[i - 1][:, :, pos - j + i:pos - j + i + 1]
                                                        for i in range(2, j + 1) if pos - j + i >= 0]
            vv = [vs[0][:, :, :max(pos - j + 2, 0)]] + [vs[i - 1][:, :, pos - j + i:pos - j + i + 1]
                                                        for i in range(2, j + 1) if pos - j + i >= 0]
            kk, vv = torch.cat(kk, 2).repeat_interleave(rep, 1), torch.cat(vv, 2).repeat_interleave(rep, 1)
            s = (q[:, :, pos:pos + 1] @ kk.transpose(2, 3)) * hd ** -0.5
            rows.append(s.softmax(-1) @ vv)
        o = torch.cat(rows, 2).transpose(1, 2).reshape(b, t, -1) @ P["layer.self_attn.o_proj.weight"].T
        hh = x + o
        m = rms(hh, P["layer.post_attention_layernorm.weight"])
        mlp = torch.nn.functional.silu(m @ P["layer.mlp.gate_proj.weight"].T) * (m @ P["layer.mlp.up_proj.weight"].T)
        gs.append(hh + mlp @ P["layer.mlp.down_proj.weight"].T)
    return gs


@pytest.mark.parametrize("steps", [2, 3])
@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_ttt_loss_and_gradients_match_torch(backend, steps):
    """The training-time test's loss (weighted steps, step j scored at t >= j-1) and its gradients, through the
    g's into the earlier steps, against the same computation in torch."""
    head = _tiny_head(backend, seed=4)
    c = head.config
    rng = np.random.default_rng(5)
    B, T, D, N = 2, 7, c.hidden_size, c.head_vocab
    f, e, nf = (rng.standard_normal((B, T, D)).astype(np.float32) for _ in range(3))
    lm = rng.standard_normal((N, D)).astype(np.float32) * 0.3
    p = np.exp(nf @ lm.T)
    p = (p / p.sum(-1, keepdims=True)).astype(np.float32)
    mask = (rng.random((B, T)) < 0.8).astype(np.float32)
    F, E, NF, L, PP, M = (minitorch.from_numpy(a, backend=backend) for a in (f, e, nf, lm, p, mask))
    gs = ttt.forward_steps(head, F, E, steps)
    loss, parts = ttt_loss(gs, [head.logits(g, L, N) for g in gs], NF, PP, M, 0.1)
    loss.backward()

    P = {n: torch.tensor(np.asarray(q.value.to_numpy()), requires_grad=True) for n, q in head.named_parameters()}
    tgs = _torch_steps(P, c, torch.tensor(f), torch.tensor(e), steps)
    tloss = 0.0
    for j, (tg, w) in enumerate(zip(tgs, ttt_weights(steps)), 1):
        tm = torch.tensor(mask)
        tm[:, :j - 1] = 0
        tfeat = (torch.nn.functional.smooth_l1_loss(tg, torch.tensor(nf), reduction="none") * tm[..., None]).sum() / (tm.sum() * D)
        tce = -(torch.tensor(p) * (tg @ torch.tensor(lm).T).log_softmax(-1) * tm[..., None]).sum() / tm.sum()
        np.testing.assert_allclose(float(parts[j - 1][0].item()), float((tfeat + 0.1 * tce).detach()), rtol=1e-4)
        tloss = tloss + w * (tfeat + 0.1 * tce)
    tloss.backward()
    for g, tg in zip(gs, tgs):
        np.testing.assert_allclose(np.asarray(g.to_numpy()), tg.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(float(loss.item()), float(tloss), rtol=1e-4)
    for name, par in head.named_parameters():
        np.testing.assert_allclose(np.asarray(par.value.grad.to_numpy()), P[name].grad.numpy(), rtol=2e-3, atol=2e-5,
                                   err_msg=name)


# -- the head's packed copy and its one-call step on the CPU ---------------------------------------------------

@pytest.fixture(scope="module")
def packed_target(tmp_path_factory):
    """A tiny qwen2 GGUF (Q8_0, 256-wide rows): packed weights, so the CPU's one-call forward applies."""
    pytest.importorskip("gguf")
    from test_models_util import packed_tiny_qwen2

    return packed_tiny_qwen2(tmp_path_factory.mktemp("packed_head_target"), seed=3)


def test_packed_head_step_is_forward_and_logits_bit_for_bit(packed_target, monkeypatch):
    """draft_step of a packed() head takes the one-call forward (decoder_forward with the fc output as its input, no
    final norm) and gives forward + logits' bits, g and logits, over a prompt-sized step and a one-token step, with
    the same KV cache; a forward that left out the layer's residual would be caught."""
    model, _ = packed_target
    head = DraftHead(DraftHeadConfig.for_target(model, head_vocab=256, intermediate_size=128), model.backend,
                     seed=4).packed()
    assert head.layer.self_attn.joined[1] == 3 and head.layer.mlp.joined[1] == 2
    lm = model.lm_head_weight()
    rng = np.random.default_rng(0)
    f, e = (minitorch.from_numpy(rng.standard_normal((1, 7, 256)).astype(np.float32)) for _ in range(2))
    calls = count_calls(monkeypatch, minitorch.FastBackend, "decoder_forward")

    def run(fast: bool):
        cache, out = head.new_cache(16), []
        with minitorch.no_grad():
            for sl in (slice(0, 6), slice(6, 7)):
                fs, es = f.narrow(1, sl.start, sl.stop - sl.start), e.narrow(1, sl.start, sl.stop - sl.start)
                if fast:
                    g, lg = head.draft_step(fs, es, cache, lm, 256)
                else:
                    gg = head(fs, es, cache)
                    g = gg.narrow(1, gg.shape[1] - 1, 1)
                    lg = head.logits(g, lm, 256)
                out += [g.to_numpy().copy(), lg.to_numpy().copy()]
        return out + [cache.keys[0].to_numpy()[0, :, :7].copy()]

    ref = run(False)
    assert calls["n"] == 0
    got = run(True)
    assert calls["n"] == 2
    for a, b in zip(ref, got):
        assert a.shape == b.shape and np.array_equal(a, b)
    from minitorch.cpu import decoder as fd

    real_linear = fd._linear
    monkeypatch.setattr(fd, "_linear", lambda x, w, b=None: real_linear(x, w, b) * np.float32(1.001) if w is
                        head.layer.mlp.down_proj.weight.value else real_linear(x, w, b))
    bad = run(True)
    assert not np.array_equal(ref[2], bad[2])


@pytest.mark.parametrize("activations", ["float32", "int8"])
def test_a_kv_only_step_writes_the_whole_steps_cache_bit_for_bit(packed_target, monkeypatch, activations):
    """draft_step(kv_only=True), how the drafter reads the prompt: the same K/V bits in the cache as the whole step, over
    a prompt of more rows than the row kernel takes (float32: BLAS; int8: the row kernel in chunks) and one within it,
    so the next step gives the same g and logits; it computes no q, attention output, MLP or logits. Both activation
    modes (int8: the CLI's on the CPU). A kv-only pass that dropped the k/v bias is caught."""
    from minitorch.cpu import decoder as fd
    from minitorch.cpu import packed as fast_packed

    if activations == "int8" and not fast_packed.int8_supported():
        pytest.skip("int8 activations need AVX2 or AVX512-VNNI")

    model, _ = packed_target
    head = DraftHead(DraftHeadConfig.for_target(model, head_vocab=256, intermediate_size=128), model.backend, seed=4)
    rng = np.random.default_rng(1)
    for p in (head.layer.self_attn.k_proj.bias, head.layer.self_attn.v_proj.bias):  # initialised to zeros
        p.update(minitorch.from_numpy(rng.standard_normal(p.value.shape).astype(np.float32)))
    head = head.packed()
    if activations == "int8":  # the head's own weights only (a fresh head: nothing to restore)
        fast_packed.set_weight_activations(head.packed_weights(), "int8")
    lm = model.lm_head_weight()
    f, e = (minitorch.from_numpy(rng.standard_normal((1, 25, 256)).astype(np.float32)) for _ in range(2))
    lw = head.layer
    unread = {id(w.value) for w in (lw.self_attn.o_proj.weight, lw.mlp.down_proj.weight)}
    unread |= {id(lw.self_attn.joined[0]), id(lw.mlp.joined[0])}
    used = []
    real_linear = fd._linear
    monkeypatch.setattr(fd, "_linear", lambda x, w, b=None: used.append(id(w)) or real_linear(x, w, b))

    def run(kv_only: bool, prompt: int):
        cache, out = head.new_cache(32), []
        with minitorch.no_grad():
            used.clear()
            got = head.draft_step(f.narrow(1, 0, prompt), e.narrow(1, 0, prompt), cache, lm, 256, kv_only=kv_only)
            assert cache.length == prompt
            if kv_only:
                assert got == (None, None) and not unread & set(used) and id(lm) not in used
            g, lg = head.draft_step(f.narrow(1, prompt, 1), e.narrow(1, prompt, 1), cache, lm, 256)
        kv = [c.to_numpy()[0, :, :prompt + 1].copy() for c in cache.keys + cache.values]
        return kv + [g.to_numpy().copy(), lg.to_numpy().copy()]

    for prompt in (9, 24):  # within packed.MAX_ROWS (the row kernel) and past it (BLAS products)
        ref, got = run(False, prompt), run(True, prompt)
        for a, b in zip(ref, got):
            assert a.shape == b.shape and np.array_equal(a, b)
    # the whole drafter: the output is the target's and the cache after every round a fresh head's
    prompt = list(range(3, 40))
    d = _CheckedHeadDrafter(head, model)
    cfg = SamplingConfig()
    assert speculative_generate(model, d, prompt, 20, cfg, gamma=3).tokens == generate(model, prompt, 20, cfg).tokens
    assert d.checked >= 5 and not d.mismatch, d.mismatch
    real_linears = fd._linears
    monkeypatch.setattr(fd, "_linears", lambda x, ws, bs, joined: real_linears(x, ws, [None] * len(bs), joined)
                        if len(ws) == 2 and joined is None and ws[0] is lw.self_attn.k_proj.weight.value
                        else real_linears(x, ws, bs, joined))
    bad = run(True, 24)
    assert ref[0].shape == bad[0].shape and not np.array_equal(ref[0], bad[0])


def test_speculative_with_a_packed_head_equals_the_target_alone(packed_target):
    model, tok = packed_target
    head = DraftHead(DraftHeadConfig.for_target(model, head_vocab=256, intermediate_size=128), model.backend,
                     seed=5).packed()
    prompt = tok.encode("Natalia sold clips to 48 of her friends in April")
    cfg = SamplingConfig()
    spec = speculative_generate(model, HeadDrafter(head, model), prompt, 30, cfg, gamma=3)
    assert spec.tokens == generate(model, prompt, 30, cfg).tokens and spec.stats["rounds"] >= 8


@pytest.mark.skipif(not __import__("minitorch.cpu.packed", fromlist=["x"]).int8_supported(),
                    reason="int8 activations need AVX2 or AVX512-VNNI")
def test_the_head_computes_in_the_targets_activation_mode(packed_target):
    """A packed head's weights (its own and the joined products) take the activation mode the target is given
    (set_cpu_activations, as load_models applies --cpu-activations): with int8, each of the layer's products is the
    int8 kernel's (a head left in the process's float32 mode drafted 2x slower on a 2-core Zen 3), and speculative
    decoding still equals the target alone."""
    from minitorch.cpu import packed as fast_packed
    from minitorch.packed import PackedWeight
    from project.cli_common import set_cpu_activations

    model, tok = packed_target
    head = DraftHead(DraftHeadConfig.for_target(model, head_vocab=256, intermediate_size=128), model.backend,
                     seed=5).packed()
    weights = head.packed_weights()
    assert len(weights) == 10 and all(isinstance(w, PackedWeight) for w in weights)  # fc, 7 products, 2 joined
    set_cpu_activations("int8", model.backend, [model, head])
    try:
        assert {w.activations for w in weights} == {"int8"}
        calls = []
        real = fast_packed.packed_linear_q8
        fast_packed.packed_linear_q8 = lambda x, w, out: (calls.append(w), real(x, w, out))[1]
        try:
            prompt = tok.encode("Natalia sold clips to 48 of her friends in April")
            spec = speculative_generate(model, HeadDrafter(head, model), prompt, 20, SamplingConfig(), gamma=3)
        finally:
            fast_packed.packed_linear_q8 = real
        assert spec.tokens == generate(model, prompt, 20, SamplingConfig()).tokens
        assert {id(w) for w in weights} & {id(w) for w in calls}  # the head's own products took the int8 kernel
    finally:
        set_cpu_activations("float32", model.backend, [model, head])
        fast_packed.set_weight_activations(model.packed_weights() + weights, None)


# -- --drafter auto: the head is the CPU's default where one exists ------------------------------------------------

def test_drafter_auto_takes_the_cache_head_where_one_exists(target, tmp_path, monkeypatch):
    """--drafter auto (the default): the draft model while the cache holds no head for the target; once one is saved
    where train_draft_head puts it (default_head_dir), the head at gamma HEAD_CPU_GAMMA on the CPU and
    HEAD_GPU_GAMMA on the CUDA-graph path (without the draft model's default --draft-extend); --gamma, --draft,
    a --draft-extend given keep their meaning."""
    from project import cli_common as cc
    from project import settings as st
    from project.one_line_parser import OneLineParser

    monkeypatch.setenv("MINITORCH_SPEC_CACHE", str(tmp_path / "cache"))
    model, _, path = target

    def resolved(*argv):
        p = OneLineParser()
        st.add_engine_args(p)
        s = cc.decide_drafter(st.resolve_settings(p.parse_args(["--target", str(path), *argv])), model)  # load_models'
        return s.drafter, s.gamma, s.extend

    gpu_model = ("model", st.GPU_MODEL_GAMMA, st.GPU_MODEL_EXTEND)  # the 0.5B with prompt lookup after its drafts
    assert resolved() == ("model", st.GAMMA, 0)  # a fresh clone: no head anywhere
    assert resolved("--backend", "cuda") == gpu_model
    save_head(DraftHead(_cfg(model), model.backend, seed=3), cc.default_head_dir(model))
    assert resolved() == ("head", st.HEAD_CPU_GAMMA, 0)
    assert resolved("--gamma", "5") == ("head", 5, 0)
    assert resolved("--draft", str(path)) == ("model", st.GAMMA, 0)  # a draft model asked for by name
    assert resolved("--drafter", "model") == ("model", st.GAMMA, 0)
    assert resolved("--draft-extend", "2") == ("model", st.GAMMA, 2)  # a draft model's flag
    assert resolved("--backend", "cuda") == ("head", st.HEAD_GPU_GAMMA, 0)  # the default extend is the model's
    assert resolved("--backend", "cuda", "--gamma", "5") == ("head", 5, 0)
    assert resolved("--backend", "cuda", "--draft-extend", "4") == ("model", st.GAMMA, 4)
    assert resolved("--backend", "cuda", "--dtype", "float32") == ("head", st.HEAD_CPU_GAMMA, 0)  # the eager engine


def test_the_repositorys_head_is_taken_when_the_cache_has_none(target, tmp_path, monkeypatch):
    """A head shipped in the repository (cli_common.SHIPPED_HEADS/<name>/, compressed) is what --drafter auto and
    --drafter head take for the target whose fingerprint its head.json names, when the cache holds none; a head the
    user trained (the cache's) comes first; another target's shipped head is never taken."""
    from project import cli_common as cc

    model, _, _ = target
    monkeypatch.setenv("MINITORCH_SPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cc, "SHIPPED_HEADS", tmp_path / "heads")
    other, _ = load_model(_other_target(tmp_path), progress=False)
    save_head(DraftHead(DraftHeadConfig.for_target(other, head_vocab=300, intermediate_size=48), other.backend),
              tmp_path / "heads" / "a-other")
    assert cc.cached_head(model) is None  # only another target's head is shipped
    shipped = DraftHead(_cfg(model, inter=64), model.backend, seed=8)
    save_head(shipped, tmp_path / "heads" / "b-tiny", "int4")
    assert cc.cached_head(model) == tmp_path / "heads" / "b-tiny"
    got = cc.load_head_for(None, model)
    assert got.config.intermediate_size == 64
    want = load_head(tmp_path / "heads" / "b-tiny", model)
    for (n, a), (_, b) in zip(want.named_parameters(), got.named_parameters()):
        np.testing.assert_array_equal(np.asarray(a.value.to_numpy()), np.asarray(b.value.to_numpy()), err_msg=n)
    save_head(DraftHead(_cfg(model), model.backend, seed=9), cc.default_head_dir(model))
    assert cc.cached_head(model) == cc.default_head_dir(model)  # the user's own head first
    assert cc.load_head_for(None, model).config.intermediate_size == 48


def test_demo_drafts_with_the_cache_head_and_equals_the_target(target, tmp_path, monkeypatch):
    """The demo with no --drafter on a target that has a head in the cache: it says so, drafts with the head, and
    its greedy tokens equal the target alone's."""
    import json
    import os

    from project.cli_common import default_head_dir

    model, _, path = target
    monkeypatch.setenv("MINITORCH_SPEC_CACHE", str(tmp_path / "cache"))
    save_head(DraftHead(_cfg(model), model.backend, seed=4), default_head_dir(model))
    r = subprocess.run([sys.executable, "project/run_spec_decoding.py", "--target", str(path), "--prompt", "ab ab ab",
                        "--max-new-tokens", "12", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert (out["settings"]["drafter"], out["settings"]["gamma"], out["settings"]["draft"]) == ("head", 3, None)
    assert "--drafter auto: the draft head" in r.stderr
    assert out["spec"]["tokens"] == out["target"]["tokens"] and len(out["target"]["tokens"]) == 12


def test_llama_cpp_bench_finds_the_head_the_cpu_default_would_take(target, tmp_path, monkeypatch):
    """project/bench/llama_cpp.py's ours_spec_head run: no head in the cache -> no run (None); a saved head -> that
    head; a --head folder that is missing -> the one-line load error, not a silent skip."""
    from project.bench import llama_cpp
    from project.cli_common import default_head_dir
    from project.settings import UserError

    model, _, _ = target
    monkeypatch.setenv("MINITORCH_SPEC_CACHE", str(tmp_path / "cache"))
    assert llama_cpp.head_for(None, model) is None
    saved = DraftHead(_cfg(model), model.backend, seed=6)
    save_head(saved, default_head_dir(model))
    got = llama_cpp.head_for(None, model)
    for (n, a), (_, b) in zip(saved.named_parameters(), got.named_parameters()):
        np.testing.assert_array_equal(np.asarray(a.value.to_numpy()), np.asarray(b.value.to_numpy()), err_msg=n)
    with pytest.raises((ModelLoadError, UserError)):
        llama_cpp.head_for(str(tmp_path / "none"), model)


# -- the head's own cache between rounds ---------------------------------------------------------------------------

class _CheckedHeadDrafter(HeadDrafter):
    """HeadDrafter that, at the start of every round, compares its cache with a fresh head run over the same
    positions from the target's own features: what the cache holds must be exactly what those inputs give.
    keep_drafts: the broken variant, a drafter that keeps its drafted positions (fed the head's own guessed
    features) after a round instead of trimming them."""

    def __init__(self, head, target, keep_drafts=False, lookup=0, prompt_window=0):
        super().__init__(head, target, lookup=lookup, prompt_window=prompt_window)
        self.keep_drafts, self.checked, self.mismatch = keep_drafts, 0, []

    def _step(self, feats, ids):
        out = super()._step(feats, ids)
        self._peak = self.cache.length
        return out

    def propose(self, tokens, gamma, cfg, rng):
        n, length, b = len(tokens), self.cache.length, self._base
        if length:
            assert b + length <= n - 1, f"the head caches {length} positions from {b} of a {n}-token context"
            ref = self.head.new_cache(self.cache.max_len)  # a fresh head over the same positions (from the window's)
            with minitorch.no_grad():
                feats = minitorch.from_numpy(self._feats[b:b + length][None].copy(), backend=self.head.backend)
                self.head.draft_step(feats, self._embed([int(t) for t in tokens[b + 1:b + length + 1]]), ref, self._lm, 8)
            for mine, fresh in zip(self.cache.keys + self.cache.values, ref.keys + ref.values):
                a, b = mine.to_numpy()[0, :, :length], fresh.to_numpy()[0, :, :length]
                if not np.allclose(a, b, rtol=1e-4, atol=1e-5):
                    self.mismatch.append((n, length, float(np.abs(a - b).max())))
            self.checked += 1
        out = super().propose(tokens, gamma, cfg, rng)
        if self.keep_drafts:
            self.cache.length = self._peak  # the drafted positions' K/V are still in the buffer
        return out


def test_the_head_cache_holds_exactly_the_verified_prefix_after_every_round(target):
    """After each round the head's cache holds only positions whose inputs were the target's features and the
    verified tokens (the same K/V a fresh head computes from them); a drafter that keeps its drafted positions
    drafts from stale state, and this check catches it. The head is the target's own copy (fc and layer from a
    trained-like init would be accepted rarely), so rounds accept drafts and the stale positions get used."""
    model, tok, _ = target
    prompt = tok.encode("Natalia sold clips to 48 of her friends in April, and then she sold half as many")
    head = DraftHead(_cfg(model), model.backend, seed=9)
    ok = _CheckedHeadDrafter(head, model)
    spec = speculative_generate(model, ok, prompt, 40, SamplingConfig(), gamma=3)
    assert spec.tokens == generate(model, prompt, 40, SamplingConfig()).tokens
    assert ok.checked >= 10 and not ok.mismatch, ok.mismatch
    broken = _CheckedHeadDrafter(head, model, keep_drafts=True)
    speculative_generate(model, broken, prompt, 40, SamplingConfig(), gamma=3)
    assert broken.mismatch, "a head that keeps its drafted positions was not caught"


def test_a_prompt_window_reads_the_prompts_last_positions_and_keeps_the_cache_exact(target):
    """prompt_window W: the head reads only the prompt's last W positions (its cache starts there; RoPE scores depend on
    relative positions only, so that is a head that sees the window alone). The output is the target's, the cache
    holds exactly those positions and the verified ones after every round, and the first round's row is what a
    fresh head gives over the window. The broken variant (a feed that forgets where the window starts) is caught."""
    model, tok, _ = target
    prompt = tok.encode("Natalia sold clips to 48 of her friends in April, and then she sold half as many")
    assert len(prompt) > 12
    head = DraftHead(_cfg(model), model.backend, seed=9)
    d = _CheckedHeadDrafter(head, model, prompt_window=8)
    spec = speculative_generate(model, d, prompt, 40, SamplingConfig(), gamma=3)
    assert spec.tokens == generate(model, prompt, 40, SamplingConfig()).tokens
    assert d.checked >= 10 and not d.mismatch, d.mismatch
    # the prompt's features through a fresh windowed drafter: its first draft row is a fresh head's over the window
    with minitorch.no_grad():
        logits, feats = model(prompt, model.new_cache(len(prompt) + 4), return_hidden=True)
        w = HeadDrafter(head, model, prompt_window=8)
        w.start(prompt, len(prompt) + 4, model.config.vocab_size)
        w.observe(feats)
        assert w._base == len(prompt) - 1 - 8 and w.cache.length == 8
        _, row = w._feed(prompt)
        ref = head.new_cache(len(prompt) + 4)
        f = feats.to_numpy().reshape(len(prompt), -1)
        b = len(prompt) - 1 - 8
        _, want = head.draft_step(minitorch.from_numpy(f[b:len(prompt) - 1][None].copy(), backend=head.backend),
                                  w._embed(prompt[b + 1:]), ref, w._lm, row.shape[0])
    np.testing.assert_allclose(row, want.to_numpy().reshape(-1), rtol=1e-5, atol=1e-5)

    class Forgets(_CheckedHeadDrafter):
        def _feed(self, tokens):
            base, self._base = self._base, 0  # reads from cache.length as if the cache started at position 0
            try:
                return super()._feed(tokens)
            finally:
                self._base = base

    broken = Forgets(head, model, prompt_window=8)
    try:
        speculative_generate(model, broken, prompt, 40, SamplingConfig(), gamma=3)
    except (AssertionError, RuntimeError, ValueError):
        return  # caught by the cache check's bounds
    assert broken.mismatch, "a windowed head that forgets where its window starts was not caught"


def test_prompt_window_must_be_a_count():
    with pytest.raises(ValueError):
        HeadDrafter.__init__(HeadDrafter.__new__(HeadDrafter), None, None, prompt_window=-1)


# -- prompt lookup first (--draft-lookup) ---------------------------------------------------------------------------

REPEATING = "the cat sat on the mat and the dog sat on the log; the cat sat on the mat and the dog sat on the"


def test_lookup_first_follows_the_target_and_keeps_the_heads_cache_exact(target):
    """Greedy rounds drafted by prompt lookup where a 2-gram matches, by the head elsewhere: the output is the target
    alone's, some rounds were looked up (a repeating prompt), and the head's cache still holds exactly the verified
    prefix at every round (its next feed catches up on the positions the looked-up rounds skipped)."""
    model, tok, _ = target
    prompt = tok.encode(REPEATING)
    head = DraftHead(_cfg(model), model.backend, seed=9)
    d = _CheckedHeadDrafter(head, model, lookup=2)
    spec = speculative_generate(model, d, prompt, 40, SamplingConfig(), gamma=3)
    assert spec.tokens == generate(model, prompt, 40, SamplingConfig()).tokens
    assert 0 < spec.stats["lookup_rounds"] < spec.stats["rounds"] and d.checked >= 3 and not d.mismatch, d.mismatch
    assert "lookup_rounds" not in speculative_generate(model, HeadDrafter(head, model), prompt, 8, SamplingConfig(),
                                                       gamma=3).stats


class _HeadOfConfidence(HeadDrafter):
    """A head whose first draft is token 42 with probability `p` (its feed's row replaced; the step itself runs)."""

    def __init__(self, *args, p: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.p = p

    def _feed(self, tokens):
        g, row = super()._feed(tokens)
        q = np.full(row.shape[0], (1.0 - self.p) / (row.shape[0] - 1))
        q[42] = self.p
        return g, np.log(q)


def test_a_lookup_round_drafts_what_followed_the_match_where_the_head_is_unsure(target):
    """Where the context's last M tokens occurred before and the head's top probability for its first draft is below
    what the looked-up drafts are expected to get accepted (a 2-gram's rates 0.5 by position before any is judged:
    0.875 of 3 drafts, against p + p^2 + p^3 for the head's), propose returns the tokens after their latest
    occurrence, having run only the head's first step; a surer head, or a shorter match, leaves the round to the head. Broken variant: the rule
    reversed (lookup where the head is surer) fails both first cases."""
    model, _, _ = target
    head = DraftHead(_cfg(model), model.backend, seed=2)
    ctx = [5, 6, 7, 8, 9, 5, 6, 7, 4, 5, 6]  # ..., 5, 6 occurred at 0 and 5 (latest: then 7, 4)
    rng = np.random.default_rng(0)
    for lookup, p, want in ((2, 0.3, [7, 4, 5]), (2, 0.9, None), (3, 0.3, None)):
        d = _HeadOfConfidence(head, model, lookup=lookup, p=p)
        d.start(ctx, 64, 300)
        d.observe(np.zeros((len(ctx), head.config.hidden_size), np.float32))
        f0 = d.forwards
        drafts, q = d.propose(ctx, 3, SamplingConfig(), rng)
        assert d.cache.length == len(ctx) - 1  # the verified prefix only, either way
        if want is not None:
            assert drafts == want and q is None and d.forwards == f0 + 1 and d.lookup_rounds == 1
        else:  # the head was surer, or the last three tokens, 4, 5, 6, never occurred before
            assert drafts[0] == 42 and d.forwards > f0 + 1 and d.lookup_rounds == 0
    d = HeadDrafter(head, model, lookup=2)
    d.start(ctx, 64, 300)
    d.observe(np.zeros((len(ctx), head.config.hidden_size), np.float32))
    assert d.propose(ctx, 3, SamplingConfig(temperature=1.0, seed=1), rng)[1] is not None  # sampling: the head


def test_lookup_min_prompt_looks_up_only_in_long_enough_prompts(target):
    """lookup_min_prompt P: a generation whose prompt has fewer than P tokens drafts by the head alone (no looked-up
    round, the head's drafts), one of P tokens or more as lookup does; each generation decides at its start, so the
    same drafter takes both in turn. The drafts are the two drafters' they stand for: lookup=0's below P, lookup's
    from P. Broken variant (the length ignored: _lookup_now kept at lookup) drafts [7, 4, 5] for the short prompt."""
    model, _, _ = target
    head = DraftHead(_cfg(model), model.backend, seed=2)
    ctx = [5, 6, 7, 8, 9, 5, 6, 7, 4, 5, 6]  # 11 tokens; ..., 5, 6 occurred before (then 7, 4, 5)

    def first_round(drafter, prompt_len):
        drafter.start(ctx[:prompt_len], 64, 300)  # the prompt: the context's first tokens; the rest as if generated
        for rows in (prompt_len, len(ctx) - prompt_len):  # the prompt's features, then the later positions'
            drafter.observe(np.zeros((rows, head.config.hidden_size), np.float32))
        return drafter.propose(ctx, 3, SamplingConfig(), np.random.default_rng(0))[0]

    gated = _HeadOfConfidence(head, model, lookup=2, p=0.3, lookup_min_prompt=8)
    plain = _HeadOfConfidence(head, model, lookup=0, p=0.3)
    looks = _HeadOfConfidence(head, model, lookup=2, p=0.3)
    assert first_round(gated, 7) == first_round(plain, 7) and gated.lookup_rounds == 0  # 7 < 8: the head's
    assert first_round(gated, 7)[0] == 42
    assert first_round(gated, 8) == first_round(looks, 8) == [7, 4, 5] and gated.lookup_rounds == 1  # 8 >= 8
    assert first_round(gated, 7)[0] == 42 and gated.lookup_rounds == 0  # decided again at each start
    with pytest.raises(ValueError, match="lookup_min_prompt"):
        HeadDrafter(head, model, lookup=2, lookup_min_prompt=-1)


def test_looked_up_drafts_are_priced_by_their_measured_acceptance(target):
    """rollback after a looked-up round counts its drafts by position (judged up to the first rejected), a 2-gram's
    apart from a 3-gram's; a rate shrinks towards the previous position's (the first towards the prior of its n-gram's
    length); a gate keeps a draft only while p * (its value) covers its row; a head sure enough of its first draft
    keeps the round, which is not counted."""
    model, _, _ = target
    head = DraftHead(_cfg(model), model.backend, seed=2)
    ctx = [5, 6, 7, 8, 9, 5, 6, 7, 4, 5, 6]
    d = _HeadOfConfidence(head, model, lookup=2, p=0.1)
    d.start(ctx, 64, 300)
    d.observe(np.zeros((len(ctx), head.config.hidden_size), np.float32))
    assert d.lookup_rate(0, 2) == pytest.approx(0.5) and d.lookup_rate(0, 3) == pytest.approx(0.8)  # the priors
    d.propose(ctx, 3, SamplingConfig(), np.random.default_rng(0))
    d.rollback(len(ctx) + 1)  # one of the 3 accepted: positions 0 and 1 judged, position 0 accepted
    assert d._counts == {2: [[1, 1], [0, 1]]}  # a 2-gram's round, counted apart from a 3-gram's
    assert d.lookup_rate(0, 2) == pytest.approx((1 + 2 * 0.5) / 3) and d.lookup_rate(0, 3) == pytest.approx(0.8)
    assert d.lookup_rate(1, 2) == pytest.approx((0 + 2 * d.lookup_rate(0, 2)) / 3)
    assert d.lookup_rate(2, 2) == pytest.approx(d.lookup_rate(1, 2))  # never judged: the previous position's

    class Gate:  # keeps a draft while p >= 0.4
        def include(self, i, p):
            return p >= 0.4

    drafts, _ = d.propose(ctx, 3, SamplingConfig(), np.random.default_rng(0), gate=Gate())
    assert drafts == [7]  # p = 0.667 kept, then 0.667 * 0.444 = 0.30 refused
    d.rollback(len(ctx))
    sure = _HeadOfConfidence(head, model, lookup=2, p=0.95)  # 0.95 + 0.95^2 + 0.95^3 against 0.875: the head's round
    sure.start(ctx, 64, 300)
    sure.observe(np.zeros((len(ctx), head.config.hidden_size), np.float32))
    drafts, _ = sure.propose(ctx, 3, SamplingConfig(), np.random.default_rng(0))
    assert drafts[0] == 42 and len(drafts) == 3 and sure.lookup_rounds == 0
    sure.rollback(len(ctx) + 1)
    assert sure._counts == {}  # only looked-up rounds are counted
    with pytest.raises(ValueError):
        HeadDrafter(head, model, lookup=4)
