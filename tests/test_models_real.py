"""Real weights (marked real_weights; fetches the offline draft, ~0.5 GB, once into the cache folder):
the Qwen2.5-Coder-0.5B-Instruct GGUF loaded by us and by transformers' own GGUF loader gives the same
greedy continuation of a GSM8K prompt and closely agreeing logits.

Tolerance: both sides dequantize the same GGUF blocks with the same `gguf` code into float32, so the
weights are bit-identical and any difference is float32 summation order (BLAS blocking, fused
kernels) accumulated through 24 layers. Logits are up to ~33 in size; we require max |diff| <= 1e-3
absolute (measured: 6.1e-5 max, 3.6e-6 mean over a 94-token GSM8K prompt, every argmax equal), i.e.
~16x headroom for other BLAS builds, and identical greedy tokens for 32 steps."""

from __future__ import annotations

import json

import numpy as np
import pytest

import minitorch
from minitorch.models import load_model
from minitorch.models.registry import resolve
from test_models_util import GSM8K

pytestmark = [pytest.mark.real_weights, pytest.mark.slow]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers needs it for GGUF loading

N_NEW = 32
ATOL = 1e-3


@pytest.fixture(scope="module")
def prompt_and_models():
    path = resolve("qwen2.5-coder-0.5b-instruct", progress=False)
    ours, tok = load_model(path, progress=False)
    with open(GSM8K) as f:
        question = json.loads(f.readline())["question"]
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": question}]))
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                            dtype=torch.float32).eval()
    yield ids, ours, ref, tok
    del ref


def test_prompt_logits_close(prompt_and_models) -> None:
    ids, ours, ref, _ = prompt_and_models
    with minitorch.no_grad():
        got = ours(ids, ours.new_cache(len(ids))).to_numpy()[0]
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].numpy()
    assert got.shape == want.shape == (len(ids), 151936)
    err = np.abs(got - want).max()
    assert err <= ATOL, f"max |diff| {err:.3e} vs max |logit| {np.abs(want).max():.1f}"
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_greedy_continuation_matches_transformers(prompt_and_models) -> None:
    ids, ours, ref, tok = prompt_and_models
    with torch.no_grad():
        out = ref.generate(torch.tensor([ids]), max_new_tokens=N_NEW, do_sample=False,
                           pad_token_id=151643)
    want = out[0, len(ids):].tolist()
    assert len(want) == N_NEW  # the worked answer is longer than N_NEW tokens (no early stop)
    got = []
    with minitorch.no_grad():
        cache = ours.new_cache(len(ids) + N_NEW)
        logits = ours(ids, cache)
        for _ in range(N_NEW):
            nxt = int(logits.to_numpy()[0, -1].argmax())
            got.append(nxt)
            logits = ours([nxt], cache)
    assert got == want, f"ours {tok.decode(got)!r}\nref  {tok.decode(want)!r}"
