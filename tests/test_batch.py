"""minitorch/generation/batch.py: continuous batching of the target alone (issue 42), on the CPU reference backend
(CpuSlots) over small random Qwen2 models.

Each row of a batch is batch-1 `generate` of its request: greedy and sampled (each request's own seed) token for
token, stop reasons included, with slots refilled as sequences end; a row's sampled tokens follow the target's
distribution (chi-square against numpy's own softmax of the model's logits). Bugs a batch decoder can have (a
refilled slot keeping the previous sequence's cache, a row reading another slot's cache, slots sharing one sampler, a
temperature dropped) are planted in CpuSlots and shown to fail these checks. Then the scheduler's contract: results
as sequences finish, requests read lazily, None as "none ready yet", one-line errors, the engine's call."""
from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

import minitorch
from minitorch import FastBackend
from minitorch.generation import (BatchRequest, CpuSlots, SamplingConfig, generate, make_engine, run_batch)
from minitorch.generation import batch as batch_mod
from minitorch.generation.engine import BATCH_MAX_LEN, DrafterSpec, batch_max_len
from test_generation_distribution import ALPHA_SIG, pooled_pvalue

V = 48
LENGTHS = (3, 9, 1, 15, 6, 4, 11)  # the 7 requests' prompt lengths
NEW = (12, 5, 20, 8, 16, 3, 10)  # ... and their max_new_tokens


def build(vocab: int = V, seed: int = 0, scale: float = 0.15, context: int = 128):
    """A small random Qwen2 (2 layers, GQA) on the CPU backend."""
    from minitorch.models import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, rope_theta=10000.0,
                      max_position_embeddings=context)
    model = Qwen2ForCausalLM(cfg, backend=FastBackend)
    r = np.random.default_rng(seed)
    model.load_weights({n: (1 + 0.1 * r.standard_normal(model.expected_shape(n)) if "norm" in n else
                            scale * r.standard_normal(model.expected_shape(n))).astype(np.float32)
                        for n, _ in model.named_parameters()})
    return model


@pytest.fixture(scope="module")
def model():
    return build()


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(1)
    return [[int(t) for t in rng.integers(0, V, size=n)] for n in LENGTHS]


@pytest.fixture(scope="module")
def stop_id(model, prompts):
    """A token the model emits before its limit in some of the 7 greedy sequences but not all: with it as the stop
    token some requests end on it ("stop") and the others run to their limit ("length")."""
    outs = [generate(model, p, n, SamplingConfig()).tokens for p, n in zip(prompts, NEW)]
    for tok in sorted({t for o in outs for t in o[:-1]}):
        hit = sum(tok in o[:-1] for o in outs)
        if 2 <= hit <= len(outs) - 2:
            return tok
    pytest.fail("no token of the greedy outputs stops some sequences and not others")


class Counting(CpuSlots):
    """CpuSlots that records its admit calls and steps."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.admits: list[list[int]] = []
        self.steps = 0

    def admit(self, entries):
        self.admits.append([slot for slot, _, _ in entries])
        return super().admit(entries)

    def step(self):
        self.steps += 1
        return super().step()


def batch_and_alone(model, prompts, stop, cfgs, slots=3):
    """(results by request index, generate()'s results, the backend): the 7 requests as one batch of `slots`, and
    each alone."""
    backend = Counting(model, slots, 64, V)
    reqs = [BatchRequest(p, n, c, key=f"r{i}") for i, (p, n, c) in enumerate(zip(prompts, NEW, cfgs))]
    got = list(run_batch(backend, reqs, SamplingConfig(), {stop}))
    assert sorted(r.index for r in got) == list(range(len(reqs)))  # every request exactly once
    assert all(r.key == f"r{r.index}" for r in got)
    alone = [generate(model, p, n, c, {stop}) for p, n, c in zip(prompts, NEW, cfgs)]
    return {r.index: r.result for r in got}, alone, backend


def mismatches(model, prompts, stop, cfgs) -> list[int]:
    got, alone, _ = batch_and_alone(model, prompts, stop, cfgs)
    return [i for i, a in enumerate(alone) if (got[i].tokens, got[i].stop_reason) != (a.tokens, a.stop_reason)]


GREEDY = [SamplingConfig()] * len(LENGTHS)
SAMPLED = [SamplingConfig(temperature=0.8, top_k=20, top_p=0.9, seed=100 + i) for i in range(len(LENGTHS))]


# ----------------------------------------------------------------------------- each row is generate() of its request

def test_greedy_batch_equals_generate_request_by_request(model, prompts, stop_id):
    got, alone, backend = batch_and_alone(model, prompts, stop_id, GREEDY)
    for i, a in enumerate(alone):
        assert got[i].tokens == a.tokens and got[i].stop_reason == a.stop_reason, i
        st = got[i].stats
        assert st["new_tokens"] == len(a.tokens) and st["target_forwards"] == len(a.tokens) - 1
        assert st["time_total"] > 0 and st["tokens_per_s"] == pytest.approx(len(a.tokens) / st["time_total"])
    reasons = [a.stop_reason for a in alone]
    assert "stop" in reasons and "length" in reasons  # the stop token ends some requests early
    # the first admit filled all 3 slots in one call; freed slots were refilled (7 admitted > 3 slots)
    assert backend.admits[0] == [0, 1, 2] and sum(map(len, backend.admits)) == 7 and len(backend.admits) > 1


def test_sampled_batch_equals_generate_with_each_requests_own_seed(model, prompts, stop_id):
    got, alone, _ = batch_and_alone(model, prompts, stop_id, SAMPLED)
    for i, a in enumerate(alone):
        assert got[i].tokens == a.tokens and got[i].stop_reason == a.stop_reason, i
    # the seeds matter: the same prompts under other seeds give other tokens
    other = [SamplingConfig(temperature=0.8, top_k=20, top_p=0.9, seed=200 + i) for i in range(len(LENGTHS))]
    assert [generate(model, p, n, c, {stop_id}).tokens for p, n, c in zip(prompts, NEW, other)] != \
        [a.tokens for a in alone]


def test_a_refilled_slot_keeping_the_previous_cache_fails_the_greedy_check(model, prompts, stop_id, monkeypatch):
    """Power: a slot refilled on top of its previous sequence's cache (stale keys and values before the prompt)."""
    monkeypatch.setattr(CpuSlots, "new_cache", lambda self, slot: self.caches[slot] or self.model.new_cache(self.max_len))
    assert mismatches(model, prompts, stop_id, GREEDY)


def test_a_row_reading_another_slots_cache_fails_the_greedy_check(model, prompts, stop_id, monkeypatch):
    """Power: a decode step of slot s reading (and appending to) the cache of the next occupied slot."""
    def crossed(self, slot, ids):
        other = (slot + 1) % self.slots
        cache = self.caches[other] if len(ids) == 1 and self.pending[other] is not None else self.caches[slot]
        return self.model(ids, cache, last_n=1)

    monkeypatch.setattr(CpuSlots, "forward", crossed)
    assert mismatches(model, prompts, stop_id, GREEDY)


def test_slots_sharing_one_sampler_fail_the_sampled_check(model, prompts, stop_id, monkeypatch):
    """Power: every slot drawing from slot 0's rng stream instead of its own request's."""
    real = CpuSlots._pick

    def shared(self, slot, logits):
        rngs = self.rngs
        self.rngs = [rngs[0] if rngs[0] is not None else r for r in rngs]
        try:
            return real(self, slot, logits)
        finally:
            self.rngs = rngs

    monkeypatch.setattr(CpuSlots, "_pick", shared)
    assert mismatches(model, prompts, stop_id, SAMPLED)


# ----------------------------------------------------------------------------- the distribution of a row

DIST_V, DIST_PROMPT, OTHER_PROMPT, N_SEEDS = 8, [1, 5, 2, 7, 3], [6, 6, 0, 4], 500
DIST_CFG = dict(temperature=0.7, top_k=6, top_p=0.95)


@pytest.fixture(scope="module")
def small():
    return build(DIST_V, seed=3, scale=0.3)


def numpy_probs(row: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """The target's sampling distribution, written out again with numpy (not sampling.py): softmax of logits /
    temperature over the top_k largest, cut to the smallest most-likely set whose mass reaches top_p."""
    x = row.astype(np.float64) / temperature
    order = np.argsort(-x, kind="stable")[:top_k]
    p = np.exp(x[order] - x[order].max())
    p /= p.sum()
    n = int(np.searchsorted(np.cumsum(p), top_p)) + 1
    out = np.zeros(row.shape[0])
    out[order[:n]] = p[:n]
    return out / out.sum()


def exact_pairs(model) -> dict[tuple[int, int], float]:
    """P(first two new tokens) after DIST_PROMPT, from the model's logits (one forward per prefix)."""
    def row(ids):
        with minitorch.no_grad():
            return np.asarray(model(ids, model.new_cache(len(ids))).to_numpy(), np.float64)[0, -1]

    first = numpy_probs(row(DIST_PROMPT), **DIST_CFG)
    out = {}
    for a in np.flatnonzero(first):
        second = numpy_probs(row(DIST_PROMPT + [int(a)]), **DIST_CFG)
        out.update({(int(a), int(b)): first[a] * second[b] for b in np.flatnonzero(second)})
    return out


def sampled_pairs(model) -> list[tuple[int, int]]:
    """The first two tokens of N_SEEDS requests of DIST_PROMPT (seeds 0..N-1), run as rows of 4-slot batches between
    requests of another prompt at another temperature (so rows in other slots hold other caches and samplers)."""
    reqs = []
    for s in range(N_SEEDS):
        reqs.append(BatchRequest(DIST_PROMPT, 2, SamplingConfig(seed=s, **DIST_CFG), key=s))
        reqs.append(BatchRequest(OTHER_PROMPT, 1 + s % 3, SamplingConfig(temperature=1.3, seed=10_000 + s), key=None))
    got = run_batch(CpuSlots(model, 4, 16, DIST_V), reqs, SamplingConfig(), ())
    return [tuple(r.result.tokens) for r in got if r.key is not None]


pvalue = pooled_pvalue  # tests/test_generation_distribution.py


def test_a_row_of_a_batch_follows_the_targets_distribution(small):
    exact = exact_pairs(small)
    assert len({a for a, _ in exact}) >= 3  # a first token with real choice in it
    assert sum(exact.values()) == pytest.approx(1.0)
    p = pvalue(sampled_pairs(small), exact)
    assert p > ALPHA_SIG, p


def test_a_dropped_temperature_fails_the_distribution_check(small, monkeypatch):
    """Power: a backend that samples at temperature 1 whatever the request asks (top-k and top-p kept). It puts
    samples where the target has none, and the chi-square sees it on the target's own cells too."""
    real = batch_mod.next_token
    monkeypatch.setattr(batch_mod, "next_token",
                        lambda row, cfg, rng: real(row, SamplingConfig(1.0, cfg.top_k, cfg.top_p, cfg.seed), rng))
    exact, samples = exact_pairs(small), sampled_pairs(small)
    inside = [s for s in samples if s in exact]
    assert pvalue(samples, exact) == 0.0 and len(inside) < len(samples)
    p = pvalue(inside, exact)
    assert p < ALPHA_SIG, p


# ----------------------------------------------------------------------------- the scheduler's contract

def test_results_come_as_sequences_finish(model, prompts):
    """A short request admitted with long ones comes back while they are still decoding: what lets a writer keep
    every finished answer when it is interrupted."""
    backend = Counting(model, 3, 64, V)
    reqs = [BatchRequest(prompts[0], 20, key="long-a"), BatchRequest(prompts[1], 2, key="short"),
            BatchRequest(prompts[2], 20, key="long-b"), BatchRequest(prompts[3], 3, key="late-short")]
    seen = [(r.key, backend.steps) for r in run_batch(backend, reqs, SamplingConfig(), ())]
    assert seen[0] == ("short", 1)  # after one step, with 19 steps of the long ones to go
    assert seen[1] == ("late-short", 3)  # admitted into the short one's slot, ended before the long ones
    assert {k for k, _ in seen[2:]} == {"long-a", "long-b"} and backend.steps == 19


def test_requests_are_read_lazily_and_the_slots_freed_when_closed(model, prompts):
    pulled = []

    def feed():
        for i in itertools.count():
            pulled.append(i)
            yield BatchRequest(prompts[i % 7], 4, key=i)

    backend = CpuSlots(model, 2, 64, V)
    it = run_batch(backend, feed(), SamplingConfig(), ())
    first = next(it)
    assert pulled == [0, 1] and first.index in (0, 1)  # two slots: two requests read, no more
    assert next(it).index in (0, 1) and pulled == [0, 1]  # both ended in the same step: read again only now
    next(it)
    assert len(pulled) == 4
    it.close()  # the caller stops early: no slot stays occupied
    assert backend.pending == [None, None]


def test_a_request_may_wait_for_a_result(model, prompts):
    """None from the requests: none ready yet. A follow-up built from an answer goes in as soon as it exists."""
    answers: dict = {}

    def feed():
        yield BatchRequest(prompts[0], 3, key="first")
        while "first" not in answers:
            yield None
        yield BatchRequest(prompts[0] + answers["first"], 3, key="follow-up")

    results = []
    for r in run_batch(CpuSlots(model, 2, 64, V), feed(), SamplingConfig(), ()):
        answers[r.key] = r.result.tokens
        results.append(r)
    assert [r.key for r in results] == ["first", "follow-up"]
    alone = generate(model, prompts[0], 6, SamplingConfig()).tokens
    assert results[0].result.tokens + results[1].result.tokens == alone  # the follow-up continues the first
    with pytest.raises(RuntimeError, match="nothing is decoding"):
        list(run_batch(CpuSlots(model, 2, 64, V), iter([None]), SamplingConfig(), ()))


def test_progress_advances_a_bar_or_calls_a_function(model, prompts):
    reqs = [BatchRequest(p, 2) for p in prompts[:4]]
    bar = SimpleNamespace(n=0)
    bar.update = lambda k: setattr(bar, "n", bar.n + k)
    list(run_batch(CpuSlots(model, 2, 64, V), reqs, SamplingConfig(), (), progress=bar))
    seen = []
    list(run_batch(CpuSlots(model, 2, 64, V), reqs, SamplingConfig(), (), progress=seen.append))
    assert bar.n == 4 and sorted(r.index for r in seen) == [0, 1, 2, 3]


def _one_line_error(fn, *match):
    with pytest.raises(ValueError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg and all(m in msg for m in match), msg
    return msg


def test_bad_input_is_one_clear_line(model, prompts):
    slots = CpuSlots(model, 2, 20, V)
    ok = BatchRequest(prompts[0], 4)

    def run(*reqs):
        return lambda: list(run_batch(slots, [ok, *reqs], SamplingConfig(), ()))

    _one_line_error(run(BatchRequest([], 4, key="q7")), "request 1 ('q7')", "prompt is empty")
    _one_line_error(run(BatchRequest(list(range(18)), 4)), "request 1", "exceeds", "20 cache positions")
    _one_line_error(run(BatchRequest(prompts[0], 0)), "request 1", "max_new_tokens must be an integer >= 1")
    assert slots.pending == [None, None]  # the good request admitted before the error was released
    _one_line_error(lambda: CpuSlots(model, 0, 20, V), "slots must be an integer >= 1")
    _one_line_error(lambda: CpuSlots(model, 2, 500, V), "max_len 500 exceeds the model's context of 128")
    engine = make_engine(model, "none", vocab_size=V)
    _one_line_error(lambda: engine.generate_batch([ok], batch=0), "batch must be an integer >= 1")
    spec = make_engine(model, DrafterSpec("ngram"), vocab_size=V)
    _one_line_error(lambda: spec.generate_batch([ok], batch=2), "target alone", "'ngram'")


# ----------------------------------------------------------------------------- the engine's call

def test_engine_generate_batch_is_run_batch_over_cpu_slots(model, prompts, stop_id):
    cfg = SamplingConfig(temperature=0.8, top_k=20, seed=5)
    engine = make_engine(model, "none", cfg, stop_ids={stop_id}, vocab_size=40)
    reqs = [BatchRequest(p, n, key=i) for i, (p, n) in enumerate(zip(prompts, NEW))]
    reqs[2] = BatchRequest(prompts[2], NEW[2], SamplingConfig(seed=9), key=2)  # its own sampling: greedy
    got = {r.key: r.result for r in engine.generate_batch(iter(reqs), batch=3)}
    for i, r in enumerate(reqs):
        want = generate(model, r.prompt_ids, r.max_new_tokens, r.sampling or cfg, {stop_id}, vocab_size=40)
        assert got[i].tokens == want.tokens and max(want.tokens) < 40, i  # the engine's vocabulary limit
    backend = engine._batch[1]
    assert isinstance(backend, CpuSlots) and (backend.slots, backend.max_len) == (3, 128)
    assert batch_max_len(model) == 128 and batch_max_len(build(context=8192)) == BATCH_MAX_LEN
    list(engine.generate_batch([reqs[0]], batch=3))
    assert engine._batch[1] is backend  # kept for the next call with the same shape
    list(engine.generate_batch([reqs[0]], batch=2, max_len=32))
    assert (engine._batch[1].slots, engine._batch[1].max_len) == (2, 32)


def test_the_cuda_graph_engine_asks_the_target_for_its_batch_decoder(model, prompts):
    """On the CUDA-graph engine the backend is the target decoder's batch_decoder(slots, max_len, vocab_size); the
    scheduler drives it like CpuSlots (a CpuSlots stands in for the GPU's decoder here)."""
    calls = []

    class Decoder:
        graph_decoder, V, max_len = True, V, 256
        config = SimpleNamespace(vocab_size=V, max_position_embeddings=100_000)

        def batch_decoder(self, slots, max_len, vocab_size):
            calls.append((slots, max_len, vocab_size))
            return CpuSlots(model, slots, min(max_len, 128), vocab_size)

    engine = make_engine(Decoder(), "none", vocab_size=V - 3)
    assert engine.on_graphs
    got = [r.result.tokens for r in engine.generate_batch([BatchRequest(prompts[1], 5)], batch=4)]
    assert calls == [(4, BATCH_MAX_LEN, V - 3)]
    assert got == [generate(model, prompts[1], 5, SamplingConfig(), vocab_size=V - 3).tokens]


def test_warm_up_runs_a_full_batch_on_the_backend_the_run_keeps(model):
    engine = make_engine(model, "none", vocab_size=V)
    assert engine.warm_up([5, 6, 7], batch=3) >= 0
    backend = engine._batch[1]
    assert (backend.slots, backend.max_len) == (3, batch_max_len(model)) and backend.pending == [None] * 3
    list(engine.generate_batch([BatchRequest([5, 6], 2)], batch=3))
    assert engine._batch[1] is backend
    plain = make_engine(model, "none", vocab_size=V)
    plain.warm_up([5])
    assert plain._batch is None  # batch 1: no batch backend made
