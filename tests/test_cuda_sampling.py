"""Sampling and speculative acceptance on the device (kernels/sampling.cu) and the GPU generation engine
(minitorch/generation/cuda.py). GPU only.

- sample_f32's filtered probabilities equal the CPU reference (logits_to_probs, float64) on random and on
  heavily tied logits, for temperature / top-k / top-p and their combinations, up to the real vocabulary
  size; the same support exactly.
- Draws follow those probabilities: Pearson chi-square against the exact distribution, cells with
  expected count < 5 pooled, significance 0.001 (fixed seeds, so the outcome is deterministic); the same
  test rejects the draft's distribution (it has power).
- spec_accept: with drafts drawn from q, the first emitted token follows p_0, the second (when the first
  draft was accepted) p_1, the third p_2; point-mass drafts (n-gram) likewise; and a draft whose q rows
  cover only the first 3/4 of the tokens (--draft-vocab: q = 0 beyond).
- The engine: top-k 1 sampling equals greedy decoding (every sampled path of the engine is exercised
  with a deterministic answer), seeds reproduce runs, the first sampled token of speculative runs
  follows the target's distribution (each with the bf16 draft, a draft proposing among 60 tokens, a draft
  with 8-bit rows, and one continued by prompt lookup), stop tokens cut exactly, the n-gram drafter, and
  run_spec_decoding.py --backend cuda end to end (also with --draft-vocab).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from cuda_helpers import needs_gpu
from minitorch.generation import SamplingConfig, logits_to_probs
from test_generation_distribution import chi2_sf

pytestmark = [pytest.mark.gpu, needs_gpu]
SIG = 1e-3


def chi2_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    n = counts.sum()
    assert np.all(probs[counts > 0] > 0), "drew a token of probability 0"
    e = n * probs
    big = e >= 5
    stat = float((((counts[big] - e[big]) ** 2) / e[big]).sum())
    dof = int(big.sum()) - 1
    if (~big).any() and e[~big].sum() > 0:
        stat += float((counts[~big].sum() - e[~big].sum()) ** 2 / e[~big].sum())
        dof += 1
    return chi2_sf(stat, max(dof, 1))


def clusters():
    """Blocks a row: 1, and the decoder's cluster size where the device has thread-block clusters."""
    from minitorch.cuda.launch import SAMPLE_CLUSTER, cluster_supported

    return [1, SAMPLE_CLUSTER] if cluster_supported() else [1]


def launch_sample(logits: np.ndarray, cfg: SamplingConfig, rows: int | None = None, draw: bool = False,
                  seed: int = 0, ld: int | None = None, C: int = 1):
    """sample_f32 over `rows` rows of logits (ld = 0 repeats one row), each row by a cluster of C
    blocks; returns (probs, ids or None)."""
    import cupy as cp

    from minitorch.cuda.launch import SAMPLE_THREADS
    from minitorch.cuda.pdl import PdlLauncher
    from minitorch.cuda.runtime import kernels

    x = cp.asarray(np.ascontiguousarray(logits, np.float32))
    V = x.shape[-1]
    rows = rows or (x.shape[0] if x.ndim == 2 else 1)
    probs = cp.zeros((rows, V), cp.float32)
    ids = cp.full(rows, -1, cp.int64)
    rng = cp.asarray(np.array([seed, 0], np.uint64))
    z = np.uint64(0)
    PdlLauncher(kernels(), pdl=False).launch(
        "sample_f32", (C, rows), (SAMPLE_THREADS,),
        (x, np.int64(V if ld is None else ld), probs, np.int64(V), np.int32(rows), z, np.int32(0), np.int32(V),
         np.float32(1.0 / cfg.temperature), np.int32(cfg.top_k), np.float32(cfg.top_p), ids if draw else z, rng),
        cluster=(C, 1, 1) if C > 1 else None)
    cp.cuda.runtime.deviceSynchronize()
    return probs.get(), (ids.get() if draw else None)


PROB_CASES = [
    dict(temperature=1.0), dict(temperature=0.7, top_k=5), dict(temperature=1.3, top_p=0.8),
    dict(temperature=0.9, top_k=50, top_p=0.9), dict(temperature=1.0, top_k=1), dict(temperature=2.0, top_p=0.3),
    dict(temperature=0.5, top_p=0.05),
]


@pytest.mark.parametrize("case", PROB_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("V, kind", [(7, "normal"), (1000, "normal"), (1000, "ties"), (151936, "normal"),
                                     (151936, "ties")])
def test_probabilities_match_the_cpu_reference(case, V, kind):
    for C in clusters():
        check_probabilities(case, V, kind, C)


def check_probabilities(case, V, kind, C):
    cfg = SamplingConfig(**case)
    r = np.random.default_rng(V + len(kind))
    rows = 3
    if kind == "ties":  # few distinct values: ties at the top-k and top-p boundaries
        logits = r.integers(0, 6, (rows, V)).astype(np.float32)
    else:
        logits = (3 * r.standard_normal((rows, V))).astype(np.float32)
    probs, _ = launch_sample(logits, cfg, C=C)
    for i in range(rows):
        ref = logits_to_probs(logits[i], cfg)
        np.testing.assert_array_equal(probs[i] > 0, ref > 0)
        np.testing.assert_allclose(probs[i], ref, rtol=2e-4, atol=1e-7)


def draws_inputs(C: int) -> tuple[np.ndarray, int]:
    """(logits (1, V), number of draws) of the draws test; its chi-square is shown on the CPU to reject
    draws from slightly wrong distributions (tests/test_sampling_power.py)."""
    V, N = 16 if C == 1 else 3000, 40_000  # a cluster splits a row of 3000 across its 16 blocks
    # 16 tokens at scale 0.7: top-p 0.7 keeps 7 of them (at 1.5 it kept one: the draws were all the argmax)
    logits = np.random.default_rng(3).standard_normal((1, V)).astype(np.float32) * (0.7 if C == 1 else 1.5)
    if C > 1:
        logits[0, V // 2:] -= 6.0  # most mass in the first half, the rest spread over the other blocks
    return logits, N


DRAW_CASES = [dict(temperature=1.0), dict(temperature=0.8, top_k=6), dict(temperature=1.2, top_p=0.7)]


@pytest.mark.parametrize("case", DRAW_CASES, ids=["t1", "topk6", "topp0.7"])
@pytest.mark.parametrize("C", [1, 16], ids=["1-block", "cluster-16"])
def test_draws_follow_the_probabilities(case, C):
    if C not in clusters():
        pytest.skip("no thread-block clusters on this device")
    cfg = SamplingConfig(**case)
    logits, N = draws_inputs(C)
    V = logits.shape[1]
    ref = logits_to_probs(logits[0], cfg)
    probs, ids = launch_sample(logits, cfg, rows=N, draw=True, seed=11, ld=0, C=C)  # every row the same logits
    assert ids.min() >= 0 and ids.max() < V
    counts = np.bincount(ids, minlength=V)
    assert chi2_pvalue(counts, ref) > SIG
    other = logits_to_probs(np.random.default_rng(4).standard_normal(V).astype(np.float32), SamplingConfig(1.0))
    assert chi2_pvalue(counts, other) < SIG  # power: another distribution is rejected
    _, again = launch_sample(logits, cfg, rows=N, draw=True, seed=11, ld=0, C=C)
    _, reseeded = launch_sample(logits, cfg, rows=N, draw=True, seed=12, ld=0, C=C)
    np.testing.assert_array_equal(again, ids)
    differ = 1.0 - float((ref ** 2).sum())  # P(two independent draws differ)
    assert abs((reseeded != ids).mean() - differ) < 0.02


def run_accept(p: np.ndarray, q: np.ndarray | None, drafts: np.ndarray, seed: int = 5, C: int = 1) -> np.ndarray:
    """spec_accept (a cluster of C blocks) once per row of drafts (N, g) with fixed p (g+1, V) and q (gq, Vq)
    (Vq <= V: a draft that proposes among the first Vq tokens; gq < g: drafts past the first gq are looked-up
    point masses; None: all point masses); returns out (N, g + 2) = [n, d_1..d_n, next, ...]."""
    import cupy as cp

    from minitorch.cuda.launch import SAMPLE_THREADS
    from minitorch.cuda.pdl import PdlLauncher
    from minitorch.cuda.runtime import kernels

    g1, V = p.shape
    g = g1 - 1
    N = drafts.shape[0]
    P = cp.asarray(p.astype(np.float32))
    Qd = cp.asarray(q.astype(np.float32)) if q is not None else None
    Vq = q.shape[1] if q is not None else 0
    gq = q.shape[0] if q is not None else g
    D = cp.asarray(drafts.astype(np.int64))
    out = cp.zeros((N, g + 2), cp.int64)
    tpos, ttok = cp.zeros(1, cp.int32), cp.zeros(1, cp.int64)
    rng = cp.asarray(np.array([seed, 0], np.uint64))
    z = np.uint64(0)
    k = PdlLauncher(kernels(), pdl=False)
    for i in range(N):
        k.launch("spec_accept", (C,), (SAMPLE_THREADS,),
                 (P, np.int64(V), z, Qd if Qd is not None else z, np.int64(max(Vq, 1)), np.int32(Vq),
                  np.int32(max(g, 1)), z, D[i],
                  np.int32(g), np.int32(gq), np.int32(V), tpos, ttok, z, out[i], rng),
                 cluster=(C, 1, 1) if C > 1 else None)
    cp.cuda.runtime.deviceSynchronize()
    assert int(rng[1].get()) == N * (g + 1)  # the kernel advanced its counter by g + 1 per round
    return out.get()


def random_probs(r: np.random.Generator, rows: int, V: int, scale: float) -> np.ndarray:
    x = np.exp(scale * r.standard_normal((rows, V)))
    return x / x.sum(axis=1, keepdims=True)


def acceptance_inputs(point_mass: bool, C: int, narrow: bool = False,
                      model_rows: int | None = None) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """(p (g+1, V), q (gq, Vq) or None, drafts (N, g)) of the acceptance test: drafts drawn from q, or each
    position's second most likely token (point mass). narrow: q covers the first 3/4 of the tokens only
    (a draft with a smaller vocabulary: q = 0 beyond; the residual draws must still follow p). model_rows:
    only the first gq drafts come from q, the rest are point masses (a draft model's tokens continued by
    prompt lookup, --draft-extend)."""
    r = np.random.default_rng(7)
    V, g, N = (8 if C == 1 else 40), 3, 12_000  # 40 tokens: every block of a 16-block cluster holds some
    p = random_probs(r, g + 1, V, 1.0)
    gq = g if model_rows is None else model_rows
    q = None if point_mass else random_probs(r, gq, V * 3 // 4 if narrow else V, 1.5)
    fixed = np.tile(np.argsort(-p[:g], axis=1)[:, 1], (N, 1))  # each position's second most likely token
    if point_mass:
        drafts = fixed
    else:
        drafts = np.concatenate([np.stack([r.choice(q.shape[1], size=N, p=q[i]) for i in range(gq)], axis=1),
                                 fixed[:, gq:]], axis=1)
    return p, q, drafts


def check_acceptance(out: np.ndarray, p: np.ndarray, q: np.ndarray | None, drafts: np.ndarray) -> None:
    """What spec_accept's rounds must satisfy: out (N, g + 2) = [n, d_1..d_n, next, ...] per row. Shown on the
    CPU to reject broken acceptance rules at these sizes (tests/test_sampling_power.py)."""
    g, V = drafts.shape[1], p.shape[1]
    n = out[:, 0]
    assert n.min() >= 0 and n.max() <= g
    assert np.all(out[:, 1:1 + g][np.arange(g)[None, :] < n[:, None]]
                  == drafts[np.arange(g)[None, :] < n[:, None]])  # accepted tokens are the drafts
    for pos in range(g + 1):  # token pos+1 of the round exists when the first pos drafts were accepted
        rows = out[n >= pos]  # pos = g: the bonus token after g accepted drafts
        tok = rows[:, 1 + pos]
        counts = np.bincount(tok, minlength=V)
        assert chi2_pvalue(counts, p[pos]) > SIG, f"position {pos + 1}"
    first = np.bincount(out[:, 1], minlength=V)
    if q is not None:  # power: the draft's own distribution is rejected (outright when a token outside q came)
        q0 = np.pad(q[0], (0, V - q.shape[1]))
        assert first[q0 == 0].sum() > 0 or chi2_pvalue(first, q0) < SIG


@pytest.mark.parametrize("C", [1, 16], ids=["1-block", "cluster-16"])
@pytest.mark.parametrize("kind", ["model-draft", "point-mass", "narrow-draft", "model+lookup"])
def test_acceptance_emits_target_distributed_tokens(kind, C):
    if C not in clusters():
        pytest.skip("no thread-block clusters on this device")
    p, q, drafts = acceptance_inputs(kind == "point-mass", C, narrow=kind == "narrow-draft",
                                     model_rows=1 if kind == "model+lookup" else None)
    check_acceptance(run_accept(p, q, drafts, C=C), p, q, drafts)


# ------------------------------------------------------------------ the engine on small random models
def pair(mode=None, propose_vocab=None, int8_weights=False, draft_gemv=None, lookup_steps=None):
    """A target decoder and a DecoderDrafter over an unrelated draft (propose_vocab: the draft proposes among
    that many first token ids only; int8_weights: its one-token steps on 8-bit rows; draft_gemv: the draft's GEMV
    instead of the target's; lookup_steps: it drafts that many tokens a round and prompt lookup continues them up
    to gamma, --draft-extend)."""
    from minitorch import FastBackend
    from minitorch.generation.cuda import DecoderDrafter
    from test_cuda_model import CONFIGS, build, decoder_of

    mode = mode or dict(gemv="ours")
    _, wt = build(CONFIGS[0], FastBackend, seed=1)
    draft_kw = dict(CONFIGS[0], hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                    num_hidden_layers=1)
    _, wd = build(draft_kw, FastBackend, seed=2)
    draft = decoder_of(draft_kw, wd, int8_weights=int8_weights, **{**mode, **({"gemv": draft_gemv} if draft_gemv else {})})
    return decoder_of(CONFIGS[0], wt, **mode), DecoderDrafter(draft, propose_vocab, lookup_steps)


PROMPT = [5, 17, 42, 8, 1, 30]


DRAFTS = {"kernels": {}, "draft-vocab-60": dict(propose_vocab=60),
          "int8": dict(int8_weights=True), "ourstc-int8": dict(draft_gemv="ourstc", int8_weights=True),
          "lookup-2": dict(lookup_steps=2)}  # gamma 4: two draft tokens, up to two looked up


@pytest.mark.parametrize("draft_kind", list(DRAFTS))
@pytest.mark.parametrize("gamma", [1, 4])
def test_top_k_1_sampling_equals_greedy(gamma, draft_kind):
    from minitorch.generation import NGramDrafter
    from minitorch.generation.cuda import generate_cuda, speculative_generate_cuda

    target, draft = pair(**DRAFTS[draft_kind])
    greedy = generate_cuda(target, PROMPT, 40).tokens
    one = SamplingConfig(temperature=1.0, top_k=1, seed=3)
    assert generate_cuda(target, PROMPT, 40, one).tokens == greedy
    spec = speculative_generate_cuda(target, draft, PROMPT, 40, one, gamma=gamma)
    assert spec.tokens == greedy and spec.stats["alpha"] < 1
    assert speculative_generate_cuda(target, draft, PROMPT, 40, gamma=gamma).tokens == greedy
    assert speculative_generate_cuda(target, NGramDrafter(), PROMPT * 3, 40, one, gamma=gamma).tokens == \
        generate_cuda(target, PROMPT * 3, 40).tokens
    adaptive = speculative_generate_cuda(target, draft, PROMPT, 40, one, gamma=gamma, adaptive_gamma=True)
    assert adaptive.tokens == greedy
    for cfg in (None, one):  # the cost budget (1..gamma a round), greedy and sampled at top-k 1
        assert speculative_generate_cuda(target, draft, PROMPT, 40, cfg, gamma=gamma, adaptive_gamma="cost").tokens \
            == greedy


def test_sampled_self_speculation_accepts_every_draft():
    """The target as its own draft (exact mode): the draft's q rows, read from its ring at the slots the
    acceptance test computes, equal the verify step's p rows bit for bit, so u * q < p always holds.
    A wrong slot or a stale row would reject drafts. Full acceptance also runs the two-token draft step."""
    from minitorch import FastBackend
    from minitorch.generation.cuda import speculative_generate_cuda
    from test_cuda_model import CONFIGS, build, decoder_of

    _, w = build(CONFIGS[0], FastBackend, seed=1)
    target, same = decoder_of(CONFIGS[0], w, gemv="ours"), decoder_of(CONFIGS[0], w, gemv="ours")
    for cfg in (SamplingConfig(temperature=1.0, seed=3), SamplingConfig(temperature=0.8, top_k=20, top_p=0.9, seed=4)):
        res = speculative_generate_cuda(target, same, PROMPT, 48, cfg, gamma=4)
        assert res.stats["alpha"] == 1.0 and res.stats["accept_length_hist"][-1] == res.stats["rounds"] - 1


def test_sampled_self_speculation_with_lookup_accepts_every_draft_token():
    """The target as its own draft, continued by prompt lookup (lookup_steps = 2, gamma 5): every draft
    token is accepted (its q rows, read at the slots after a first step of up to 5 tokens, equal p); the looked-
    up ones only where they match. Greedy: the output equals greedy decoding and some looked-up tokens were
    accepted (a repetitive prompt)."""
    from minitorch import FastBackend
    from minitorch.generation.cuda import DecoderDrafter, generate_cuda, speculative_generate_cuda
    from test_cuda_model import CONFIGS, build, decoder_of

    _, w = build(CONFIGS[0], FastBackend, seed=1)
    target = decoder_of(CONFIGS[0], w, gemv="ours")
    same = DecoderDrafter(decoder_of(CONFIGS[0], w, gemv="ours"), lookup_steps=2)
    for cfg in (SamplingConfig(temperature=1.0, seed=3), SamplingConfig(temperature=0.8, top_k=20, top_p=0.9, seed=4)):
        st = speculative_generate_cuda(target, same, PROMPT * 4, 48, cfg, gamma=5).stats
        acc, judged = st["per_position_acceptance"], st["per_position_judged"]
        assert acc[0] == acc[1] == 1.0 and judged[0] >= st["rounds"] - 1
    res = speculative_generate_cuda(target, same, PROMPT * 4, 48, gamma=5)
    assert res.tokens == generate_cuda(target, PROMPT * 4, 48).tokens
    st = res.stats
    assert st["draft_forwards"] < st["accepted"]  # looked-up tokens were accepted: no draft step made them


def test_vocabularies_of_different_sizes():
    from minitorch import FastBackend
    from minitorch.generation.cuda import generate_cuda, speculative_generate_cuda
    from test_cuda_model import CONFIGS, build, decoder_of

    target, _ = pair()
    small = dict(CONFIGS[0], vocab_size=90, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                 num_key_value_heads=1, num_hidden_layers=1)
    draft = decoder_of(small, build(small, FastBackend, seed=4)[1], gemv="ours")
    ar = generate_cuda(target, PROMPT, 40, vocab_size=90).tokens
    assert max(ar) < 90
    assert speculative_generate_cuda(target, draft, PROMPT, 40, gamma=3).tokens == ar
    cfg = SamplingConfig(temperature=1.0, top_p=0.9, seed=2)
    assert max(speculative_generate_cuda(target, draft, PROMPT, 40, cfg, gamma=3).tokens) < 90


@pytest.mark.parametrize("draft_kind", ["kernels", "ourstc-int8"])
def test_seeds_reproduce_sampled_runs_and_stops_cut(draft_kind):
    from minitorch.generation.cuda import generate_cuda, speculative_generate_cuda

    target, draft = pair(**DRAFTS[draft_kind])
    cfg = SamplingConfig(temperature=1.0, seed=5)
    a = speculative_generate_cuda(target, draft, PROMPT, 48, cfg, gamma=4)
    b = speculative_generate_cuda(target, draft, PROMPT, 48, cfg, gamma=4)
    c = speculative_generate_cuda(target, draft, PROMPT, 48, SamplingConfig(temperature=1.0, seed=6), gamma=4)
    assert a.tokens == b.tokens and a.tokens != c.tokens and len(a.tokens) == 48
    st = a.stats
    assert st["accepted"] <= st["drafted"] and st["new_tokens"] == st["accepted"] + st["target_tokens"] == 48
    ar = generate_cuda(target, PROMPT, 48, cfg)
    assert ar.tokens == generate_cuda(target, PROMPT, 48, cfg).tokens
    greedy = generate_cuda(target, PROMPT, 48).tokens
    stop = greedy[20]
    cut = greedy[:greedy.index(stop) + 1]
    res = speculative_generate_cuda(target, draft, PROMPT, 48, stop_ids={stop}, gamma=4)
    assert res.tokens == cut and res.stop_reason == "stop"
    assert generate_cuda(target, PROMPT, 48, stop_ids={stop}).tokens == cut


@pytest.mark.parametrize("draft_kind", list(DRAFTS))
def test_first_sampled_token_follows_the_target(draft_kind):
    from minitorch.generation.cuda import speculative_generate_cuda

    target, draft = pair(**DRAFTS[draft_kind])
    cfg0 = SamplingConfig(temperature=1.0, top_k=8)
    target.prefill(PROMPT)  # greedy setting: the logits of the prompt's last position
    ref = logits_to_probs(target.logits.ravel()[:target.nv].get().astype(np.float64), cfg0)
    N = 1500
    first = [speculative_generate_cuda(target, draft, PROMPT, 3, SamplingConfig(1.0, 8, seed=s), gamma=4).tokens[0]
             for s in range(N)]
    counts = np.bincount(first, minlength=ref.size)
    assert chi2_pvalue(counts, ref) > SIG


def test_cli_backend_cuda_end_to_end(model_folders):
    from test_run_spec_decoding import _run

    common = ("--target", str(model_folders / "target"), "--draft", str(model_folders / "draft"),
              "--max-new-tokens", "16", "--prompt", "Tom has 3 apples.", "--json")
    res = _run(*common, "--backend", "cuda")
    assert res.returncode == 0, res.stderr
    gpu = json.loads(res.stdout)
    assert gpu["spec"]["tokens"] == gpu["target"]["tokens"]  # greedy, exact verify: lossless
    assert gpu["settings"]["backend"] == "cuda" and len(gpu["spec"]["tokens"]) > 0
    res = _run(*common, "--backend", "cuda", "--temperature", "0.8", "--top-p", "0.9", "--drafter", "ngram")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["spec"]["stats"]["new_tokens"] > 0
    res = _run(*common, "--backend", "cuda", "--draft-vocab", "50")  # the draft proposes among 50 token ids
    assert res.returncode == 0, res.stderr
    narrow = json.loads(res.stdout)
    assert narrow["spec"]["tokens"] == narrow["target"]["tokens"] == gpu["target"]["tokens"]
    res = _run(*common, "--backend", "cuda", "--draft-extend", "3")  # gamma 4 + up to 3 looked-up tokens
    assert res.returncode == 0, res.stderr
    ext = json.loads(res.stdout)
    assert ext["spec"]["tokens"] == gpu["target"]["tokens"] and ext["settings"]["draft_extend"] == 3


from test_run_spec_decoding import model_folders  # noqa: E402,F401  (the fixture)
