"""A trained draft head drafting on the CUDA-graph path (minitorch/cuda/head.py HeadDecoder, generation/cuda.py
HeadGpuDrafter), against the CPU engine's HeadDrafter (minitorch/generation/head_drafter.py) as the reference.

GPU (marked gpu, skipped without one):
- greedy speculative_generate_cuda with the head equals generate_cuda (the target alone) token for token, for
  several gammas, prompts (one-token, short, several prefill chunks), prefill paths and the head's kernels;
- the head's proposals on the GPU are the CPU head's: every round's drafts, teacher-forced on the CPU from the
  same context (the target's features from a CPU model of the same bf16 weights, the head's own features fed
  back), equal the CPU argmax wherever the CPU's top-two margin exceeds twice the bf16 tolerance, and the GPU's
  logits of each round's last draft step are within that tolerance of the CPU's;
- a head that reads the wrong verify row's feature is caught by that comparison (and stays lossless);
- sampled runs: the first token follows the target's distribution (chi-square, as tests/test_cuda_sampling.py's
  test for the draft model), top-k 1 equals greedy, seeds reproduce;
- the CLI runs --backend cuda --drafter head end to end, lossless.

CPU (always run): the drafter's host logic over fake decoders (which rows the prefill feeds, the first step's
source and size each round), as_gpu_drafter, and the CLI's head handling on the graph path (no refusal; a
missing head is one line, exit 2).
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

import minitorch
from minitorch.generation import SamplingConfig, logits_to_probs

from cuda_helpers import needs_gpu, round_bf16

PROMPTS = [[5, 17, 42, 8, 1, 30], [7], [3 + (i * 13) % 90 for i in range(37)]]  # short, one token, 3 prefill chunks
HEAD_VOCAB = 32
# bf16 tolerance of the head's logits against the float32 CPU head on the same bf16 weights: activations are bf16
# at every stage of the target's last layers and of the head (relative error 2^-9 a rounding, a few roundings
# deep, summed over H = 64 terms), so the error scales with the logits: the bound of tests/test_cuda_model.py's
# bf16 model test (relative part). A draft whose CPU top-two margin exceeds twice this is decided the same way on
# both; about half the steps are (measured on the CPU head alone).


def logit_tol(ref: np.ndarray) -> float:
    return 0.05 * float(np.abs(ref).max()) + 0.005


# ------------------------------------------------------------------ models
def _models(head_seed=3, inter=96):
    """(CPU target on bf16-rounded weights, its weights, CPU head on bf16-rounded weights, the head's weights)."""
    from minitorch import FastBackend
    from minitorch.cuda.decoder import weights_from_model
    from minitorch.models.draft_head import DraftHead, DraftHeadConfig
    from test_cuda_model import CONFIGS, build

    model, w = build(CONFIGS[0], FastBackend, seed=1)
    model.load_weights({k: round_bf16(v) for k, v in w.items()})
    head = DraftHead(DraftHeadConfig.for_target(model, head_vocab=HEAD_VOCAB, intermediate_size=inter), FastBackend,
                     seed=head_seed)
    hw = weights_from_model(head)
    hw["fc.weight"] = hw["fc.weight"] * 4  # logits of a few units (max ~6): the bf16 tolerance is then relative
    for name, p in head.named_parameters():  # the GPU keeps the fc bias in float32, every other weight in bf16
        if name != "fc.bias":
            p.update(minitorch.from_numpy(round_bf16(hw[name]), backend=FastBackend))
    return model, w, head, hw


def _decoders(w, head, hw, target_mode=None, head_gemv="ours", graph_prefill=False, head_int8=False):
    from minitorch.cuda.head import HeadDecoder
    from test_cuda_model import CONFIGS, decoder_of

    target = decoder_of(CONFIGS[0], w, graph_prefill=graph_prefill, **(target_mode or dict(gemv="ours")))
    return target, HeadDecoder(head.config, hw, target, gemv=head_gemv, int8_weights=head_int8)


@pytest.fixture(scope="module")
def models():
    return _models()


# ------------------------------------------------------------------ (1) greedy == the target alone
@pytest.mark.parametrize("setup", [
    dict(), dict(head_gemv="ourstc"), dict(head_gemv="ours1"), dict(target_mode=dict(gemv="tc"), head_gemv="ourstc"),
    dict(graph_prefill=True), dict(head_int8=True), dict(head_int8=True, head_gemv="ourstc")],
    ids=["ours", "head-ourstc", "head-ours1", "target-tc", "graph-prefill", "head-int8", "head-int8-ourstc"])
@pytest.mark.parametrize("gamma", [1, 3, 5])
@pytest.mark.gpu
@needs_gpu
def test_greedy_with_the_head_equals_the_target(models, setup, gamma):
    from minitorch.generation.cuda import HeadGpuDrafter, generate_cuda, speculative_generate_cuda

    _, w, head, hw = models
    target, hdec = _decoders(w, head, hw, **setup)
    for prompt in PROMPTS:
        ref = generate_cuda(target, prompt, 40).tokens
        res = speculative_generate_cuda(target, HeadGpuDrafter(hdec), prompt, 40, gamma=gamma)
        assert res.tokens == ref, (prompt, gamma)
        assert res.stats["drafted"] > 0 and res.stats["new_tokens"] == 40
        # a bare HeadDecoder is wrapped as the head's drafter; adaptive gamma passes through first steps of any size
        assert speculative_generate_cuda(target, hdec, prompt, 40, gamma=gamma, adaptive_gamma=True).tokens == ref
        # the cost budget: 1..gamma drafts a round by the measured GPU times, the output still the target's
        cost = speculative_generate_cuda(target, hdec, prompt, 40, gamma=gamma, adaptive_gamma="cost")
        assert cost.tokens == ref and sum(cost.stats["draft_choices"].values()) == cost.stats["rounds"]
        assert min(cost.stats["draft_choices"]) >= 1 and max(cost.stats["draft_choices"]) <= gamma


@pytest.mark.parametrize("steps, gamma", [(1, 4), (2, 5), (3, 3)])
@pytest.mark.gpu
@needs_gpu
def test_greedy_with_the_head_and_lookup_equals_the_target(models, steps, gamma):
    """--draft-extend with the head: it drafts `steps` tokens, prompt lookup continues them up to gamma in the verify
    graph (point masses), and the head's next round reads the target's rows of whatever was accepted."""
    from minitorch.generation.cuda import HeadGpuDrafter, generate_cuda, speculative_generate_cuda

    _, w, head, hw = models
    target, hdec = _decoders(w, head, hw, target_mode=dict(gemv="tc"), head_gemv="ourstc")
    d = HeadGpuDrafter(hdec, lookup_steps=steps)
    for prompt in PROMPTS:
        ref = generate_cuda(target, prompt, 40).tokens
        res = speculative_generate_cuda(target, d, prompt, 40, gamma=gamma)
        assert res.tokens == ref, (prompt, steps, gamma)
        st = res.stats
        assert 0 < st["draft_forwards"] <= st["rounds"] * min(steps, gamma)  # the head drafts its share only
        assert st["drafted"] > st["draft_forwards"] or steps >= gamma  # lookup filled the rest of the rounds
        one = SamplingConfig(temperature=1.0, top_k=1, seed=3)  # sampled, top-k 1: the greedy text again
        assert speculative_generate_cuda(target, d, prompt, 40, one, gamma=gamma).tokens == ref
        cfg = SamplingConfig(temperature=0.8, top_k=20, top_p=0.9, seed=5)
        a = speculative_generate_cuda(target, d, prompt, 40, cfg, gamma=gamma)
        assert a.tokens == speculative_generate_cuda(target, d, prompt, 40, cfg, gamma=gamma).tokens


@pytest.mark.parametrize("lookup, gamma, budget", [(1, 4, False), (2, 4, "cost"), (3, 5, False)])
@pytest.mark.gpu
@needs_gpu
def test_greedy_with_lookup_first_equals_the_target(models, lookup, gamma, budget):
    """--draft-lookup with the head: where an n-gram of `lookup` or more matched, ngram_select puts prompt lookup's
    tokens in the head's drafts' place inside the verify graph; the text is the target alone's, with a fixed gamma and
    with the budget. A prompt that repeats makes the lookup match."""
    from minitorch.generation.cuda import HeadGpuDrafter, generate_cuda, speculative_generate_cuda

    _, w, head, hw = models
    target, hdec = _decoders(w, head, hw, target_mode=dict(gemv="tc"), head_gemv="ourstc")
    d = HeadGpuDrafter(hdec, lookup_first=lookup)
    for prompt in PROMPTS + [PROMPTS[0] * 3]:
        ref = generate_cuda(target, prompt, 40).tokens
        res = speculative_generate_cuda(target, d, prompt, 40, gamma=gamma, adaptive_gamma=budget)
        assert res.tokens == ref, (prompt, lookup, gamma)


# ------------------------------------------------------------------ (2) proposals == the CPU head's
class Recorder:
    """Wraps a HeadGpuDrafter: after each round's draft, the context (prompt + emitted), the drafts the head wrote
    (its history at the target's position onwards) and the logits of its last draft step."""

    def __new__(cls, hdec):
        from minitorch.generation.cuda import HeadGpuDrafter

        class _Rec(HeadGpuDrafter):
            def prefill(self, prompt, max_new_tokens, vocab):
                self.context, self.rounds = list(prompt), []

            def draft(self, target, g, first_T, cfg):
                g, gq = super().draft(target, g, first_T, cfg)
                if g > 0:
                    target.stream.synchronize()
                    p0 = int(target.pos.get(stream=target.stream)[0])
                    head = self.device
                    drafts = [int(t) for t in head.history[p0:p0 + g].get(stream=target.stream)]
                    last = head.logits[0, :head.nv].get(stream=target.stream).astype(np.float64)
                    self.rounds.append((list(self.context), drafts, last))
                return g, gq

            def emitted(self, tokens):
                self.context.extend(tokens)

        return _Rec(hdec)


def _cpu_features(model, ids):
    with minitorch.no_grad():
        _, h = model(ids, None, return_hidden=True)
    return np.asarray(h.to_numpy(), np.float32)[0]


def cpu_round(model, head, context, drafts, lm=None):
    """The CPU head's logits for each draft of a round, teacher-forced with the GPU's drafts: HeadDrafter's
    positions and features (the target's for verified positions, the head's own g after), run uncached
    (tests/test_draft_head.py shows the cached drafter equals this). lm: the LM head's rows (default the target's)."""
    n = len(context)
    feats = list(_cpu_features(model, context[:n - 1]))  # f_0 .. f_{n-2}
    toks = list(context[1:n])  # position t reads x_{t+1}
    emb, lm = model.model.embed_tokens, model.lm_head_weight() if lm is None else lm
    out = []
    for i in range(len(drafts)):
        with minitorch.no_grad():
            g = head(minitorch.from_numpy(np.stack(feats)[None].astype(np.float32)),
                     emb(minitorch.tensor([toks], dtype="int64")))
            out.append(np.asarray(head.logits(g, lm, HEAD_VOCAB).to_numpy(), np.float64)[0, -1])
        feats.append(np.asarray(g.to_numpy(), np.float32)[0, -1])
        toks.append(drafts[i])
    return out


def compare_proposals(model, head, rounds, lm=None):
    """(steps, decisive steps, decisive mismatches, logit errors over tolerance) of recorded GPU rounds."""
    steps = decisive = 0
    bad, far = [], []
    for context, drafts, last in rounds:
        ref = cpu_round(model, head, context, drafts, lm)
        for i, (d, row) in enumerate(zip(drafts, ref)):
            steps += 1
            top = np.sort(row)[::-1]
            if top[0] - top[1] > 2 * logit_tol(row):
                decisive += 1
                if int(np.argmax(row)) != d:
                    bad.append((len(context), i, d, int(np.argmax(row))))
        err = float(np.abs(last[:ref[-1].size] - ref[-1]).max())
        if last.size != ref[-1].size or err > logit_tol(ref[-1]):
            far.append((len(context), err, logit_tol(ref[-1])))
    return steps, decisive, bad, far


def record(w, head, hw, prompt, gamma, n=40, **setup):
    from minitorch.generation.cuda import speculative_generate_cuda

    target, hdec = _decoders(w, head, hw, **setup)
    rec = Recorder(hdec)
    res = speculative_generate_cuda(target, rec, prompt, n, gamma=gamma)
    return rec.rounds, res


@pytest.mark.parametrize("setup", [dict(), dict(head_gemv="ourstc", graph_prefill=True)], ids=["ours", "ourstc"])
@pytest.mark.gpu
@needs_gpu
def test_gpu_proposals_are_the_cpu_heads(models, setup):
    model, w, head, hw = models
    steps = decisive = 0
    for prompt, gamma in ((PROMPTS[0], 3), (PROMPTS[2], 4)):
        rounds, _ = record(w, head, hw, prompt, gamma, **setup)
        s, d, bad, far = compare_proposals(model, head, rounds)
        assert not bad, f"GPU drafts differ from the CPU head's at decisive steps: {bad[:5]}"
        assert not far, f"GPU head logits off the CPU head's by more than the bf16 tolerance: {far[:5]}"
        steps, decisive = steps + s, decisive + d
    assert steps >= 40 and decisive >= 10, (steps, decisive)  # the comparison decided something


def _int8_reference(model, head, hw):
    """A CPU head holding what HeadDecoder(int8_weights=True) computes with: fc and the layer's projections
    dequantized from quantize_rows_int8's codes of their bf16 rows, and the target LM head's first HEAD_VOCAB rows
    likewise (returned as a tensor for cpu_round's lm)."""
    from minitorch import FastBackend
    from minitorch.cuda.decoder import quantize_rows_int8
    from minitorch.models.draft_head import DraftHead

    def deq(v):
        codes, scale = quantize_rows_int8(np, round_bf16(np.asarray(v, np.float32)))
        return (codes.astype(np.float32) * scale[:, None]).astype(np.float32)

    ref = DraftHead(head.config, FastBackend, seed=0)
    for name, p in ref.named_parameters():
        v = hw[name] if name == "fc.bias" else round_bf16(hw[name])
        p.update(minitorch.from_numpy(deq(v) if v.ndim == 2 else np.asarray(v, np.float32), backend=FastBackend))
    lm = np.asarray(model.lm_head_weight().to_numpy(), np.float32)[:HEAD_VOCAB]
    return ref, minitorch.from_numpy(deq(lm), backend=FastBackend)


@pytest.mark.parametrize("head_gemv", ["ours", "ourstc"])
@pytest.mark.gpu
@needs_gpu
def test_int8_head_proposals_are_the_cpu_heads_on_its_8bit_rows(models, head_gemv):
    """HeadDecoder(int8_weights=True) (--gpu-draft-weights, a head): its one-row steps (two-row too under "ours")
    read 8-bit copies of fc, the layer and the LM head's head_vocab rows; its drafts are those of a CPU head on the
    dequantized rows at every decisive step, its logits within the bf16 tolerance; the target keeps bf16 rows."""
    model, w, head, hw = models
    ref, lm = _int8_reference(model, head, hw)
    steps = decisive = 0
    for prompt, gamma in ((PROMPTS[0], 3), (PROMPTS[2], 4)):
        rounds, res = record(w, head, hw, prompt, gamma, head_gemv=head_gemv, head_int8=True)
        s, d, bad, far = compare_proposals(model, ref, rounds, lm)
        assert not bad, f"int8 GPU drafts differ from the CPU head's on the same rows: {bad[:5]}"
        assert not far, f"int8 GPU head logits off the CPU head's by more than the bf16 tolerance: {far[:5]}"
        steps, decisive = steps + s, decisive + d
    assert steps >= 40 and decisive >= 10, (steps, decisive)
    target, hdec = _decoders(w, head, hw, head_gemv=head_gemv, head_int8=True)
    assert not target.q8 and hdec.q8[target.lm_head.data.ptr][0].shape[0] == hdec.head_vocab


@pytest.mark.gpu
@needs_gpu
def test_an_int8_head_reading_shifted_lm_head_rows_is_caught(models, monkeypatch):
    """The comparison above has power: 8-bit LM head rows taken one row late (a token's logit from the next
    token's row) are caught."""
    from minitorch.cuda.head import HeadDecoder

    good = HeadDecoder._quantize_int8

    def rolled(self):
        good(self)
        codes, scales = self.q8[self.lm_head.data.ptr]
        self.q8[self.lm_head.data.ptr] = (self.cp.roll(codes, -1, axis=0), self.cp.roll(scales, -1))

    monkeypatch.setattr(HeadDecoder, "_quantize_int8", rolled)
    model, w, head, hw = models
    ref, lm = _int8_reference(model, head, hw)
    with pytest.raises(AssertionError):
        rounds, _ = record(w, head, hw, PROMPTS[2], 4, head_int8=True)
        _, _, bad, far = compare_proposals(model, ref, rounds, lm)
        assert not bad and not far


@pytest.mark.gpu
@needs_gpu
def test_a_head_reading_the_wrong_feature_row_is_caught(models, monkeypatch):
    """The round's first step reads the verify rows shifted by one (the feature of the next position): the target
    still decides every token (lossless), but the proposals comparison above fails."""
    from minitorch.cuda.head import HeadDecoder
    from minitorch.generation.cuda import generate_cuda

    model, w, head, hw = models
    right = HeadDecoder._sources

    def wrong(self, source):
        src = right(self, source)
        return (self.target.xn[1:],) + src[1:] if source == "round" else src

    monkeypatch.setattr(HeadDecoder, "_sources", wrong)
    caught = 0
    for prompt, gamma in ((PROMPTS[0], 3), (PROMPTS[2], 4)):
        rounds, res = record(w, head, hw, prompt, gamma)
        _, _, bad, far = compare_proposals(model, head, rounds)
        caught += len(bad) + len(far)
        target, _ = _decoders(w, head, hw)
        assert res.tokens == generate_cuda(target, prompt, 40).tokens
    assert caught > 0


# ------------------------------------------------------------------ (3) sampling
@pytest.mark.gpu
@needs_gpu
def test_first_sampled_token_with_the_head_follows_the_target(models):
    from minitorch.generation.cuda import HeadGpuDrafter, speculative_generate_cuda
    from test_cuda_sampling import SIG, chi2_pvalue

    _, w, head, hw = models
    target, hdec = _decoders(w, head, hw)
    prompt = PROMPTS[0]
    cfg0 = SamplingConfig(temperature=1.0, top_k=8)
    target.prefill(prompt)  # greedy setting: the logits of the prompt's last position
    ref = logits_to_probs(target.logits.ravel()[:target.nv].get().astype(np.float64), cfg0)
    drafter = HeadGpuDrafter(hdec)
    N = 1500
    first = [speculative_generate_cuda(target, drafter, prompt, 3, SamplingConfig(1.0, 8, seed=s), gamma=4).tokens[0]
             for s in range(N)]
    counts = np.bincount(first, minlength=ref.size)
    assert chi2_pvalue(counts, ref) > SIG


@pytest.mark.gpu
@needs_gpu
def test_sampled_runs_with_the_head_reproduce_and_top_k_1_is_greedy(models):
    from minitorch.generation.cuda import HeadGpuDrafter, generate_cuda, speculative_generate_cuda

    _, w, head, hw = models
    target, hdec = _decoders(w, head, hw, head_gemv="ourstc")
    d = HeadGpuDrafter(hdec)
    for prompt in PROMPTS:
        greedy = generate_cuda(target, prompt, 40).tokens
        one = SamplingConfig(temperature=1.0, top_k=1, seed=3)
        assert speculative_generate_cuda(target, d, prompt, 40, one, gamma=3).tokens == greedy
        cfg = SamplingConfig(temperature=0.8, top_k=20, top_p=0.9, seed=5)
        a = speculative_generate_cuda(target, d, prompt, 40, cfg, gamma=4)
        b = speculative_generate_cuda(target, d, prompt, 40, cfg, gamma=4)
        assert a.tokens == b.tokens and len(a.tokens) == 40 and max(a.tokens) < target.V
        st = a.stats
        assert st["accepted"] <= st["drafted"] and st["new_tokens"] == st["accepted"] + st["target_tokens"] == 40


@pytest.mark.gpu
@needs_gpu
def test_capture_covers_the_heads_round_shapes(models):
    from minitorch.generation.cuda import HeadGpuDrafter, capture_speculative_graphs, speculative_generate_cuda

    _, w, head, hw = models
    target, hdec = _decoders(w, head, hw)
    d = HeadGpuDrafter(hdec)
    capture_speculative_graphs(target, d, PROMPTS[2], 4)
    keys = set(hdec.graphs)
    assert {("head", "round", T, None) for T in range(1, 6)} <= keys and ("head", "self", 1, None) in keys
    speculative_generate_cuda(target, d, PROMPTS[0], 40, gamma=4)
    assert set(hdec.graphs) == keys  # nothing captured inside a run


# ------------------------------------------------------------------ the CLI on the GPU
@pytest.mark.gpu
@needs_gpu
def test_cli_backend_cuda_drafter_head_end_to_end(model_folders, tmp_path):
    from minitorch.models import load_model
    from minitorch.models.draft_head import DraftHead, DraftHeadConfig
    from minitorch.models.head_io import save_head
    from test_run_spec_decoding import _run

    target, _ = load_model(model_folders / "target", progress=False)
    save_head(DraftHead(DraftHeadConfig.for_target(target, head_vocab=300, intermediate_size=48), target.backend,
                        seed=1), tmp_path / "head", dtype="float16")
    common = ("--target", str(model_folders / "target"), "--drafter", "head", "--head", str(tmp_path / "head"),
              "--max-new-tokens", "16", "--prompt", "Tom has 3 apples.", "--json", "--backend", "cuda")
    res = _run(*common)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["spec"]["tokens"] == out["target"]["tokens"] and len(out["spec"]["tokens"]) > 0
    assert out["spec"]["stats"]["drafted"] > 0
    res = _run(*common, "--temperature", "0.8", "--top-p", "0.9")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["spec"]["stats"]["new_tokens"] > 0


from test_run_spec_decoding import model_folders  # noqa: E402,F401  (the fixture)


# ================================================================== CPU: host logic
class FakeArr(np.ndarray):
    def get(self, stream=None):
        return np.array(self)

    def set(self, x, stream=None):
        self[...] = x


class FakeStream:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def synchronize(self):
        pass


class FakeTarget:
    """What HeadGpuDrafter reads of a target decoder: prefill chunks of max_tokens with after_chunk, and xn rows
    holding each chunk's features (here: row r = the position's index, so a test sees which positions fed)."""

    def __init__(self, max_tokens=4, H=2):
        self.max_tokens, self.H, self.max_len, self.V = max_tokens, H, 64, 50
        self.xn = np.zeros((max_tokens, H), np.float32)
        self.tokens = np.zeros(max_tokens, np.int64).view(FakeArr)
        self.stream = FakeStream()
        self.graph_prefill = False
        self.config = SimpleNamespace(max_position_embeddings=64)
        self.cached = []

    def prefill(self, prompt, after_chunk=None):
        for s in range(0, len(prompt), self.max_tokens):
            part = prompt[s:s + self.max_tokens]
            self.cached.extend(part)
            self.xn[:len(part)] = np.arange(s, s + len(part))[:, None]
            if after_chunk is not None:
                after_chunk(s, len(part))

    def set_position(self, p):
        pass


class FakeHead:
    def __init__(self, target, max_tokens=3):
        self.target, self.max_tokens, self.max_len, self.V, self.head_vocab = target, max_tokens, 64, 50, 20
        self.config = target.config
        self.calls, self.fed, self.pos = [], [], None
        self.stream = target.stream

    def set_position(self, p):
        self.pos = p

    def feed_rows(self, feats, ids):
        self.fed.extend(zip([int(r[0]) for r in feats[:len(ids)]], ids))

    def set_feature(self, row, tok):
        self.first = (int(row[0]), int(tok))

    def feed(self, source, T):
        self.calls.append((source, T))

    def share_stream(self, other):
        pass


@pytest.mark.parametrize("n", [2, 3, 6, 9, 10])
def test_head_prefill_feeds_positions_with_the_next_token_and_keeps_the_last_feature(n):
    """Head position t reads (f_t, x_{t+1}): the prefill feeds positions 0..n-3 over the target's chunks (in steps
    of the head's max_tokens) and keeps (f_{n-2}, x_{n-1}) for the first round's one-row step."""
    from minitorch.generation.cuda import HeadGpuDrafter

    target = FakeTarget()
    head = FakeHead(target)
    d = HeadGpuDrafter(head)
    prompt = list(range(100, 100 + n))
    d.prefill_target(target, prompt)
    assert head.fed == [(t, prompt[t + 1]) for t in range(n - 2)]
    assert head.first == (n - 2, prompt[n - 1]) and head.pos == n - 2
    assert target.cached == prompt[:-1]


def test_head_rounds_feed_the_verified_rows_then_their_own_features():
    from minitorch.generation.cuda import HeadGpuDrafter

    target = FakeTarget()
    head = FakeHead(target)
    d = HeadGpuDrafter(head)
    d.prefill_target(target, [1, 2, 3, 4, 5])
    cfg = SamplingConfig()
    assert d.draft(target, 3, 1, cfg) == (3, 3)
    assert head.calls == [("self", 1)] * 3  # after the prefill: the prompt's last feature, then its own
    head.calls.clear()
    assert d.next_first_T(2, 3) == 3  # two drafts accepted: three verified rows (pending, d_1, d_2)
    assert d.draft(target, 3, 3, cfg) == (3, 3)
    assert head.calls == [("round", 3), ("self", 1), ("self", 1)]
    head.calls.clear()
    d.next_first_T(0, 3)
    assert d.draft(target, 1, 1, cfg) == (1, 1) and head.calls == [("round", 1)]
    head.calls.clear()
    assert d.draft(target, 0, 1, cfg) == (0, 0) and head.calls == []  # a run's last round drafts nothing
    # a one-token prompt: no feature, the first round drafts nothing; the next reads the verified row
    d.prefill_target(target, [9])
    assert d.draft(target, 3, 1, cfg) == (0, 0) and head.calls == []
    d.next_first_T(0, 0)
    assert d.draft(target, 2, 1, cfg) == (2, 2) and head.calls == [("round", 1), ("self", 1)]


def test_head_with_lookup_drafts_its_share_then_reads_every_verified_row():
    """--draft-extend with the head: it drafts lookup_steps tokens a round (prompt lookup adds the rest in the verify
    graph), and its next first step reads the target's rows of every accepted token, looked-up ones too."""
    from minitorch.generation.cuda import HeadGpuDrafter

    target = FakeTarget()
    head = FakeHead(target)
    d = HeadGpuDrafter(head, lookup_steps=2)
    d.prefill_target(target, [1, 2, 3, 4, 5])
    cfg = SamplingConfig()
    assert d.draft(target, 5, 1, cfg) == (5, 2) and head.calls == [("self", 1)] * 2
    head.calls.clear()
    assert d.next_first_T(4, 2) == 5  # both head drafts and two looked-up tokens accepted: five verified rows
    assert d.draft(target, 5, 5, cfg) == (5, 2) and head.calls == [("round", 5), ("self", 1)]
    head.calls.clear()
    assert d.draft(target, 1, 1, cfg) == (1, 1) and head.calls == [("round", 5)]  # a short round: the head's alone


def test_head_drafter_checks_its_decoder_and_gamma():
    from minitorch.generation.cuda import HeadGpuDrafter, as_gpu_drafter

    target = FakeTarget()
    head = FakeHead(target, max_tokens=4)
    assert isinstance(as_gpu_drafter(head), HeadGpuDrafter)
    d = HeadGpuDrafter(head)
    d.check(target, [1, 2, 3], 10, 3)
    with pytest.raises(ValueError, match="max_tokens"):
        d.check(target, [1, 2, 3], 10, 4)
    with pytest.raises(ValueError, match="another target"):
        d.check(FakeTarget(), [1, 2, 3], 10, 3)


# ================================================================== CPU: the CLI on the graph path
def _settings(**kw):
    from project.settings import Settings

    return Settings(**{**dict(backend="cuda", drafter="head", target="t", draft="d"), **kw})


def test_cli_graph_path_no_longer_refuses_a_head(monkeypatch):
    from minitorch.generation.cuda import HeadGpuDrafter
    from project import cli_common

    seen = {}
    monkeypatch.setattr(cli_common, "_load_gpu",
                        lambda s, need_draft=None, progress=True: seen.setdefault("settings", s) and "models")
    assert cli_common.load_models(_settings()) == "models" and seen["settings"].drafter == "head"
    target = SimpleNamespace(graph_decoder=True, V=10)  # a CudaDecoder to the engine
    m = cli_common.Models(settings=_settings(gamma=4, extend=0), target=target, tokenizer=None, vocab_size=10,
                          stop_ids=set(), load_seconds=0, head=FakeHead(FakeTarget()))
    assert isinstance(m.engine().drafter, HeadGpuDrafter)
    with pytest.raises(ValueError, match="no draft head"):
        cli_common.Models(settings=_settings(gamma=4, extend=0), target=target, tokenizer=None, vocab_size=10,
                          stop_ids=set(), load_seconds=0).engine("head")


def test_cli_graph_path_missing_head_is_one_line_exit_2(monkeypatch, tmp_path, capsys):
    """Past the GPU check (faked), a missing head ends the load with one line and exit 2, before any decoder of a
    head is built."""
    from project import cli_common
    import minitorch.cuda.decoder as decoder_mod
    import minitorch.cuda.head  # noqa: F401  (imported before CudaDecoder is faked: its class stays the real one's)

    from test_cuda_model import CONFIGS, build

    model, _ = build(CONFIGS[0], minitorch.FastBackend, seed=1)
    monkeypatch.setattr(cli_common, "require_gpu", lambda: None)
    monkeypatch.setattr("minitorch.models.load_model", lambda *a, **k: (model, SimpleNamespace(vocab_size=97)))

    class FakeDecoder:
        def __init__(self, cfg, w, **kw):
            self.V, self.config = cfg.vocab_size, cfg

        @classmethod
        def from_model(cls, model, **kw):
            return cls(model.config, None, **kw)

    monkeypatch.setattr(decoder_mod, "CudaDecoder", FakeDecoder)
    monkeypatch.setattr("minitorch.cuda.launch.tensor_cores_supported", lambda: True)
    settings = _settings(head=str(tmp_path / "none"))

    def main():
        cli_common.load_models(settings)

    with pytest.raises(SystemExit) as e:
        cli_common.run_cli(main)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "no draft head" in err, err


@pytest.mark.parametrize("weights, hidden, int8", [("auto", 64, True), ("bf16", 64, False), ("int8", 64, True),
                                                   ("auto", 24, False)])
def test_cli_gpu_draft_weights_reach_the_heads_decoder(monkeypatch, weights, hidden, int8):
    """--gpu-draft-weights: auto builds the head's decoder with 8-bit rows where its sizes allow (as a draft model's),
    bf16 without; the target's decoder never gets them."""
    from project import cli_common
    from project.settings import GpuSettings
    import minitorch.cuda.decoder as decoder_mod
    import minitorch.cuda.head as head_mod

    from test_cuda_model import CONFIGS, build

    model, _ = build(CONFIGS[0], minitorch.FastBackend, seed=1)
    monkeypatch.setattr(cli_common, "require_gpu", lambda: None)
    monkeypatch.setattr("minitorch.models.load_model", lambda *a, **k: (model, SimpleNamespace(vocab_size=97,
                                                                                              stop_token_ids=[0])))
    built = []

    class FakeDecoder:
        def __init__(self, cfg, w, **kw):
            self.V, self.config = cfg.vocab_size, cfg
            built.append(("target", kw))

        @classmethod
        def from_model(cls, model, **kw):
            return cls(model.config, None, **kw)

    class FakeHeadDecoder:
        def __init__(self, cfg, w, target, **kw):
            built.append(("head", kw))

    hcfg = SimpleNamespace(hidden_size=hidden, intermediate_size=4 * hidden, num_attention_heads=2,
                           head_dim=hidden // 2)
    monkeypatch.setattr(decoder_mod, "CudaDecoder", FakeDecoder)
    monkeypatch.setattr(decoder_mod, "weights_from_model", lambda m: {})
    monkeypatch.setattr(head_mod, "HeadDecoder", FakeHeadDecoder)
    monkeypatch.setattr(cli_common, "decide_drafter", lambda s, t: s)
    monkeypatch.setattr(cli_common, "load_head_for", lambda folder, t: SimpleNamespace(config=hcfg))
    cli_common.load_models(_settings(gpu=GpuSettings(draft_weights=weights)), progress=False)
    (_, target_kw), (kind, head_kw) = built
    assert kind == "head" and head_kw["int8_weights"] is int8 and not target_kw.get("int8_weights")
