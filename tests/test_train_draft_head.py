"""project/train_draft_head.py on a tiny random target: training raises acceptance, a label bug does not,
an interrupted run resumes to the same weights, and the data rules hold (no evaluation sets, annotations
stripped).

Acceptance is measured as the engine measures it: greedy speculative decoding with the head (HeadDrafter) on
held-out problems, drafted / accepted tokens counted by speculative_generate.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from minitorch.generation import SamplingConfig, generate, speculative_generate
from minitorch.generation.head_drafter import HeadDrafter
from minitorch.models import load_model
from minitorch.models.draft_head import DraftHead, load_head

pytest.importorskip("torch")
import train_draft_head  # noqa: E402
from evaluation.data import build_prompt  # noqa: E402
from test_models_util import hf_qwen2, save_hf, tiny_bpe  # noqa: E402
from training import loop  # noqa: E402
from training.data import clean_gsm8k_answer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
N_PROBLEMS, HELDOUT = 40, 6


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny target, the first GSM8K train problems, and answers the target sampled for them (more data)."""
    root = tmp_path_factory.mktemp("train_head")
    save_hf(hf_qwen2(seed=0, max_position_embeddings=1024), root / "t", tiny_bpe())
    model, tok = load_model(root / "t", progress=False)
    with gzip.open(ROOT / "data" / "gsm8k" / "train.jsonl.gz", "rt") as f:
        rows = [json.loads(next(f)) for _ in range(N_PROBLEMS)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recs = []
    for i, r in enumerate(rows[:N_PROBLEMS - HELDOUT]):
        out = generate(model, tok.encode(build_prompt(tok, r["question"])), 48, SamplingConfig())  # greedy: the text the target writes
        recs.append({"id": f"train-{i}", "mode": "target", "text": tok.decode(out.tokens), "stop_reason": out.stop_reason})
    (root / "gen.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return model, tok, root, rows


def _train(root: Path, out: str, *extra: str) -> Path:
    argv = ["--target", str(root / "t"), "--data-file", str(root / "train.jsonl"), "--generated", str(root / "gen.jsonl"),
            "--heldout", str(HELDOUT), "--head-vocab", "403", "--intermediate-size", "96", "--tokens-per-step", "2048",
            "--lr", "3e-3", "--warmup", "10", "--max-seq-len", "512", "--eval-every", "1000", "--quiet", "--no-plot",
            "--output", str(root / out), *extra]
    assert train_draft_head.main(argv) == 0
    return root / out


def _acceptance(model, tok, head, rows) -> float:
    """Acceptance of the head's first draft (gamma 1) over the target's greedy answers to the held-out problems."""
    drafted = accepted = 0
    for r in rows[-4:]:  # held-out problems
        st = speculative_generate(model, HeadDrafter(head, model), tok.encode(build_prompt(tok, r["question"])), 96,
                                  SamplingConfig(), gamma=1).stats
        drafted, accepted = drafted + st["drafted"], accepted + st["accepted"]
    return accepted / drafted


@pytest.fixture(scope="module")
def trained(setup):
    model, tok, root, rows = setup
    out = _train(root, "good", "--epochs", "8")
    return load_head(out, model), out


def test_training_raises_acceptance_over_an_untrained_head(setup, trained):
    model, tok, _, rows = setup
    head, out = trained
    untrained = _acceptance(model, tok, DraftHead(head.config, model.backend), rows)
    good = _acceptance(model, tok, head, rows)
    assert good > untrained + 0.1, (good, untrained)
    report = json.loads((out / "report.json").read_text())
    assert report["evals"] and report["evals"][-1]["top1"] > 0.2  # held-out top-1 agreement with the target
    assert json.loads((out / "head.json").read_text())["training"]["tokens"] > 0


def test_labels_shifted_by_one_position_do_not_train_a_drafter(setup, trained, monkeypatch):
    """The same run with the labels of position t taken from t+2 instead of t+1 (an off-by-one in the data
    alignment): the loss still falls, but the head agrees with the target far less often than the correct
    training's, on held-out text and in speculative decoding."""
    model, tok, root, rows = setup
    real = loop.build_batch

    def shifted(*a, **k):
        b = real(*a, **k)
        nf, p = b.next_feats, b.probs
        T = nf.shape[1]
        b.next_feats = _cat_last(nf.narrow(1, 1, T - 1), nf.narrow(1, T - 1, 1))
        b.probs = _cat_last(p.narrow(1, 1, T - 1), p.narrow(1, T - 1, 1))
        return b

    monkeypatch.setattr(loop, "build_batch", shifted)
    out = _train(root, "shifted", "--epochs", "8")
    top1 = {name: json.loads((p / "report.json").read_text())["evals"][-1]["top1"] for name, p in
            (("good", trained[1]), ("bad", out))}
    # a random target's text repeats itself, so even the wrong label carries some signal: the bar is relative
    # (seen: top-1 0.12-0.13 against 0.23-0.32, acceptance 0.11-0.13 against 0.20)
    assert top1["bad"] < 0.7 * top1["good"], top1
    good = _acceptance(model, tok, trained[0], rows)
    bad = _acceptance(model, tok, load_head(out, model), rows)
    assert bad < 0.8 * good, (bad, good)
    print(f"top-1 {top1}, acceptance good {good:.3f} shifted {bad:.3f}")


def _cat_last(a, b):
    from minitorch import nn

    return nn.cat([a, b], 1).contiguous()


def test_an_interrupted_run_resumes_to_the_same_weights(setup, monkeypatch):
    model, tok, root, rows = setup
    straight = load_head(_train(root, "straight", "--max-steps", "12", "--save-every", "5"), model)
    real = loop.train_step
    calls = {"n": 0}

    def dies_at_8(*a, **k):
        calls["n"] += 1
        if calls["n"] == 8:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(loop, "train_step", dies_at_8)
    with pytest.raises(KeyboardInterrupt):
        _train(root, "cut", "--max-steps", "12", "--save-every", "5")
    monkeypatch.setattr(loop, "train_step", real)
    state = json.loads((root / "cut" / "checkpoint" / "state.json").read_text())
    assert state["step"] == 5
    resumed = load_head(_train(root, "cut", "--max-steps", "12", "--save-every", "5", "--resume"), model)
    for (n, a), (_, b) in zip(straight.named_parameters(), resumed.named_parameters()):
        np.testing.assert_allclose(np.asarray(b.value.to_numpy()), np.asarray(a.value.to_numpy()), rtol=1e-5, atol=1e-6,
                                   err_msg=n)


def test_gsm8k_answers_are_cleaned_like_the_target_writes():
    ans = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nShe sold 48+24 = <<48+24=72>>72 clips.\n#### 1,072"
    assert clean_gsm8k_answer(ans) == ("Natalia sold 48/2 = 24 clips in May.\nShe sold 48+24 = 72 clips.\n"
                                       "The final answer is $\\boxed{1072}$.")


def test_the_targets_own_answers_come_first_so_a_time_limit_keeps_them(setup):
    """load_sequences puts the --generated answers before the reference answers: the features are extracted in
    that order, so a --time-limit that cuts the extraction drops reference text, not the target's own."""
    model, tok, root, rows = setup
    args = train_draft_head.parse_args(["--target", str(root / "t"), "--data-file", str(root / "train.jsonl"),
                                        "--generated", str(root / "gen.jsonl"), "--heldout", str(HELDOUT)])
    train, held = train_draft_head.load_sequences(args, tok)
    sources = [s.source for s in train]
    n_gen = sources.count("gen.jsonl")
    assert n_gen > 0 and sources[:n_gen] == ["gen.jsonl"] * n_gen, sources
    assert len(held) == HELDOUT and all(s.source == "train.jsonl" for s in held)
