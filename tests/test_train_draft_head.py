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
from minitorch.models.draft_head import DraftHead
from minitorch.models.head_io import load_head

pytest.importorskip("torch")
from project import train_draft_head  # noqa: E402
from project.evaluation.data import build_prompt  # noqa: E402
from test_models_util import hf_qwen2, save_hf, tiny_bpe  # noqa: E402
from project.training import loop  # noqa: E402
from project.training.data import clean_gsm8k_answer  # noqa: E402

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
    train, held, held_gen, _ = train_draft_head.load_sequences(args, tok)
    assert not held_gen  # gen.jsonl's records have no question of their own
    sources = [s.source for s in train]
    n_gen = sources.count("gen.jsonl")
    assert n_gen > 0 and sources[:n_gen] == ["gen.jsonl"] * n_gen, sources
    assert len(held) == HELDOUT and all(s.source == "train.jsonl" for s in held)
    (root / "gen_copy.jsonl").write_text((root / "gen.jsonl").read_text())  # the same answers in a second file
    args.generated = [str(root / "gen.jsonl"), str(root / "gen_copy.jsonl")]
    twice, _, _, _ = train_draft_head.load_sequences(args, tok)
    assert len(twice) == len(train)  # count once


# -- training-time test (--ttt-steps) -----------------------------------------------------------------

def _random_batch(head, B=2, T=8, seed=0):
    import minitorch

    rng = np.random.default_rng(seed)
    c = head.config
    D, N = c.hidden_size, c.head_vocab
    f, e, nf = (rng.standard_normal((B, T, D)).astype(np.float32) for _ in range(3))
    lm = (rng.standard_normal((N, D)) * 0.3).astype(np.float32)
    p = np.exp(nf @ lm.T)
    mask = (rng.random((B, T)) < 0.8).astype(np.float32)
    t = (minitorch.from_numpy(a, backend=head.backend) for a in (f, e, nf, (p / p.sum(-1, keepdims=True)).astype(np.float32), mask))
    batch = loop.Batch(*t, next_argmax=np.full((B, T), -1), n_tokens=int(mask.sum()))
    return batch, minitorch.from_numpy(lm, backend=head.backend)


def _small_head(seed=3):
    import minitorch
    from minitorch.models.draft_head import DraftHeadConfig

    cfg = DraftHeadConfig(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                          rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=128, head_vocab=40,
                          target_fingerprint="0" * 16)
    return DraftHead(cfg, minitorch.FastBackend, seed=seed)


def test_one_ttt_step_is_the_training_step_of_before_bit_for_bit():
    """--ttt-steps 1 (the default): train_step's loss parts, gradients and updated weights are exactly those of the
    step as it was (forward, head_loss, backward, clip, Adam); so are those of ttt_loss over forward_steps(.., 1)."""
    from minitorch import Adam
    from project.training.objective import head_loss, ttt_loss
    from project.training.ttt import forward_steps

    def before(head, opt, batch, lm):  # train_step before --ttt-steps, verbatim
        opt.zero_grad()
        g = head(batch.feats, batch.emb)
        logits = head.logits(g, lm, lm.shape[0])
        loss, feat, ce = head_loss(g, logits, batch.next_feats, batch.probs, batch.mask, 0.1)
        loss.backward()
        norm = loop.clip_gradients(head.parameters(), 0.5)
        opt.step()
        return {"loss": float(loss.item()), "feat": float(feat.item()), "ce": float(ce.item()), "grad_norm": norm}

    def via_steps(head, opt, batch, lm):  # the same through forward_steps and ttt_loss with one step
        opt.zero_grad()
        gs = forward_steps(head, batch.feats, batch.emb, 1)
        loss, [(_, feat, ce)] = ttt_loss(gs, [head.logits(gs[0], lm, lm.shape[0])], batch.next_feats, batch.probs,
                                          batch.mask, 0.1)
        loss.backward()
        norm = loop.clip_gradients(head.parameters(), 0.5)
        opt.step()
        return {"loss": float(loss.item()), "feat": float(feat.item()), "ce": float(ce.item()), "grad_norm": norm}

    runs = []
    for step in (lambda h, o, b, lm: loop.train_step(h, o, b, lm, 0.1, 0.5, 1), before, via_steps):
        head = _small_head()
        opt = Adam(head.parameters(), lr=1e-2)
        recs, grads = [], None
        for i in range(2):
            batch, lm = _random_batch(head, seed=i)
            recs.append(step(head, opt, batch, lm))
            grads = grads or {n: np.asarray(p.value.grad.to_numpy()).copy() for n, p in head.named_parameters()}
        runs.append((recs, grads, {n: np.asarray(p.value.to_numpy()) for n, p in head.named_parameters()}))
    for recs, grads, weights in runs[1:]:
        assert recs == runs[0][0]
        for n in grads:
            np.testing.assert_array_equal(grads[n], runs[0][1][n], err_msg=n)
            np.testing.assert_array_equal(weights[n], runs[0][2][n], err_msg=n)


def test_two_ttt_steps_train_and_report_each_step():
    """--ttt-steps 2: the objective is step 1's loss + 0.8 x step 2's, both reported; the step lowers it."""
    from minitorch import Adam

    head = _small_head()
    opt = Adam(head.parameters(), lr=3e-3)
    batch, lm = _random_batch(head)
    recs = [loop.train_step(head, opt, batch, lm, 0.1, 0.5, 2) for _ in range(5)]
    for r in recs:
        assert set(r) == {"loss", "feat", "ce", "grad_norm", "loss_step2"}
        np.testing.assert_allclose(r["loss"], r["feat"] + 0.1 * r["ce"] + 0.8 * r["loss_step2"], rtol=1e-5)
    assert recs[-1]["loss"] < recs[0]["loss"]


@pytest.mark.parametrize("value", ["0", "5", "-1"])
def test_ttt_steps_out_of_range_is_one_line_exit_2(value):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "project/train_draft_head.py", "--ttt-steps", value], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--ttt-steps must be in 1..4" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_decoder_features_on_the_cpu_is_one_line_exit_2():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "project/train_draft_head.py", "--features-by", "decoder"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--features-by decoder" in r.stderr and "--backend cuda" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_ttt_steps_limit_is_the_heads():
    from project.training.ttt import TTT_MAX_STEPS

    assert train_draft_head.TTT_MAX_STEPS == TTT_MAX_STEPS


def test_a_ttt_run_records_its_steps_and_each_steps_agreement(setup):
    """--ttt-steps 2 on the tiny target: head.json and report.json name it; the held-out evaluation reports the
    top-1 agreement of draft steps 1..3 (as a run without it does)."""
    model, tok, root, rows = setup
    out = _train(root, "ttt2", "--max-steps", "3", "--ttt-steps", "2")
    training = json.loads((out / "head.json").read_text())["training"]
    assert training["ttt_steps"] == 2 and training["ttt_weights"] == [1.0, 0.8]
    report = json.loads((out / "report.json").read_text())
    ev = report["evals"][-1]
    assert report["ttt_steps"] == 2 and len(ev["top1_steps"]) == 3 and ev["top1_steps"][0] == ev["top1"]
    assert all(0.0 <= a <= 1.0 for a in ev["top1_steps"])


def test_a_time_limited_schedule_ends_its_decay_when_the_time_does():
    """--time-limit paces the cosine decay: the projected end of the schedule is this run's pace over the budget,
    never past --epochs' total, and the learning rate reaches its floor (a tenth) at that step."""
    f = loop.time_bounded_total
    assert f(300, 0, 3, elapsed=1.0, budget=100.0) == 300  # too few steps to know the pace
    assert f(300, 0, 10, elapsed=20.0, budget=100.0) == 50  # 2 s a step, 100 s: 50 steps
    assert f(300, 40, 50, elapsed=20.0, budget=100.0) == 90  # a resumed run counts its own steps from 40
    assert f(30, 0, 10, elapsed=20.0, budget=1000.0) == 30  # never past the epochs' total
    assert f(300, 0, 10, elapsed=200.0, budget=100.0) == 10  # over time: the schedule ends here
    lr = 2e-3
    assert loop.lr_at(50, f(300, 0, 10, 20.0, 100.0), lr, 5) == pytest.approx(0.1 * lr)
    assert loop.lr_at(50, 300, lr, 5) > 0.8 * lr  # what the run did before: its decay barely begun when time ran out


# -- --init and answers to problems the target wrote itself ---------------------------------------------------

def test_init_starts_from_a_saved_head_and_records_it(setup, trained):
    """--init DIR: training starts from that head's weights (at a learning rate of 1e-12, one step leaves them as
    they were, up to the float16 file), not from a fresh initialisation, and head.json names where it started."""
    model, tok, root, rows = setup
    head, src = trained
    out = _train(root, "init", "--init", str(src), "--max-steps", "1", "--lr", "1e-12", "--warmup", "1")
    again = load_head(out, model)
    fresh = DraftHead(head.config, model.backend, seed=0)
    for (n, a), (_, b), (_, c) in zip(head.named_parameters(), again.named_parameters(), fresh.named_parameters()):
        a, b, c = (np.asarray(t.value.to_numpy()) for t in (a, b, c))
        np.testing.assert_allclose(b, a, rtol=2e-3, atol=1e-6, err_msg=n)
        if a.std() > 0:
            assert not np.allclose(b, c, rtol=2e-3, atol=1e-6), n  # not what a run without --init starts from
    training = json.loads((out / "head.json").read_text())["training"]
    assert training["init"]["from"] == str(src) and training["init"]["training"]["steps"] > 1
    # the starting head is evaluated before the first step: the gain is read off one report; a step of 1e-12
    # leaves its agreement where it was
    evals = json.loads((out / "report.json").read_text())["evals"]
    assert [e["step"] for e in evals] == [0, 1]
    assert evals[0]["top1"] == pytest.approx(evals[1]["top1"], abs=1e-9)


def test_features_of_an_earlier_run_are_reused_where_the_data_match(setup, monkeypatch):
    """--features DIR: a second run into another --output finds every sequence's features done in DIR and extracts
    none; a run with other sequences (another held-out split) starts DIR afresh rather than train on stale rows."""
    from project.training.features import FeatureStore

    root = setup[2]
    feat = root / "shared_features"
    done_at_start = []
    extract = FeatureStore.extract

    def spy(self, *a, **k):
        done_at_start.append((self.done, len(self.seqs)))
        return extract(self, *a, **k)

    monkeypatch.setattr(FeatureStore, "extract", spy)
    _train(root, "feat1", "--features", str(feat), "--features-only")  # one call fills the folder, saves no head
    assert not (root / "feat1" / "head.safetensors").exists() and not (root / "feat1" / "checkpoint").exists()
    _train(root, "feat2", "--features", str(feat), "--max-steps", "1")
    _train(root, "feat3", "--features", str(feat), "--max-steps", "1", "--heldout", str(HELDOUT - 1))
    (d1, n1), (d2, n2), (d3, n3) = done_at_start
    assert d1 == 0 and d2 == n2 == n1 and d3 == 0
    assert not (root / "feat2" / "features").exists() and (root / "feat2" / "head.safetensors").exists()


def test_init_with_another_targets_head_is_one_line_exit_2(setup, trained, tmp_path, capsys):
    model, tok, root, rows = setup
    other = tmp_path / "other"
    other.mkdir()
    cfg = json.loads((trained[1] / "head.json").read_text())
    cfg["target_fingerprint"] = "f" * 16
    (other / "head.json").write_text(json.dumps(cfg))
    (other / "head.safetensors").write_bytes((trained[1] / "head.safetensors").read_bytes())
    with pytest.raises(SystemExit) as e:
        train_draft_head.run_cli(lambda: train_draft_head.main(
            ["--target", str(root / "t"), "--data-file", str(root / "train.jsonl"), "--init", str(other),
             "--output", str(tmp_path / "out"), "--quiet"]))
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another target" in err[0], err


def test_records_carrying_their_own_question_are_trained_on_under_the_benchmark_prompt(setup):
    """write_problems.py's answers carry their question (no GSM8K id to look up): the sequence is the benchmark's
    prompt for that question + the answer; one whose question is an evaluation problem (MATH-500's first, with
    other spacing and case) is dropped."""
    from project.training.data import generated_sequences

    model, tok, root, rows = setup
    math500 = json.loads((ROOT / "data" / "limo" / "eval" / "math500.jsonl").read_text().splitlines()[0])["problem"]
    recs = [{"id": "self-0", "question": "What is $1+2$?", "mode": "spec", "text": "It is $3$.", "stop_reason": "stop"},
            {"id": "self-1", "question": "  " + math500.upper().replace(" ", "  "), "mode": "spec", "text": "x",
             "stop_reason": "stop"}]
    seqs = generated_sequences(tok, recs, {}, 512, source="answers.jsonl")
    assert len(seqs) == 1
    prompt = tok.encode(build_prompt(tok, "What is $1+2$?"))
    assert seqs[0].ids[:seqs[0].n_prompt] == prompt and seqs[0].n_prompt == len(prompt)
    assert tok.decode(seqs[0].ids[len(prompt):]).startswith("It is $3$.")


def test_self_written_answers_are_held_out_by_question_and_reported(setup, tmp_path):
    """--heldout-generated N: N distinct own questions of the --generated files, spread over them (the last of each of
    N equal stretches: 2, 5 and 9 of 10; the last N, 7-9, would all be of one kind where a folder's files hold one
    kind after another), are held out of training (in every file they appear in) and the held-out evaluation reports
    the head's agreement on them as well."""
    model, tok, root, rows = setup
    recs = [{"id": f"self-{i}", "question": f"What is ${i}+{i + 1}$?", "mode": "spec",
             "text": f"It is ${2 * i + 1}$. " * 6, "stop_reason": "stop"} for i in range(10)]
    (tmp_path / "self.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (tmp_path / "self_copy.jsonl").write_text("".join(json.dumps(recs[i]) + "\n" for i in (2, 5, 9)))  # held again
    base = ["--target", str(root / "t"), "--data-file", str(root / "train.jsonl"), "--heldout", str(HELDOUT),
            "--generated", str(tmp_path / "self.jsonl"), str(tmp_path / "self_copy.jsonl")]
    train, held, held_self, groups = train_draft_head.load_sequences(
        train_draft_head.parse_args(base + ["--heldout-generated", "3"]), tok)
    assert groups == [tmp_path.name] * 3  # one folder
    held_q = [tok.decode(s.ids[:s.n_prompt]) for s in held_self]
    assert all(f"What is ${i}+{i + 1}$?" in q for q, i in zip(held_q, (2, 5, 9)))
    prompts = lambda seqs: {tuple(s.ids[:s.n_prompt]) for s in seqs}  # noqa: E731
    assert len(held) == HELDOUT and len(held_self) == 3
    assert not prompts(held_self) & prompts(train)  # no held-out question is trained on, from either file
    assert sum(s.source.startswith("self") for s in train) == 7
    out = _train(root, "heldgen", "--max-steps", "2", "--heldout-generated", "3", "--generated", str(tmp_path / "self.jsonl"))
    ev = json.loads((out / "report.json").read_text())["evals"][-1]
    assert 0.0 <= ev["generated"]["top1"] <= 1.0 and len(ev["generated"]["top1_steps"]) == 3 and ev["generated"]["tokens"] > 0
    assert "by_folder" not in ev["generated"]


def test_each_folder_of_self_written_text_is_held_out_and_reported_apart(setup, tmp_path):
    """Each folder of --generated files (data/chat, data/selfmath, a machine's /root/texts) gives its own N distinct
    questions, spread over it, to the held-out set, and the evaluation reports each folder's agreement and the pooled one,
    which weighs each folder by the positions it counted."""
    model, tok, root, rows = setup
    for folder, n in (("chat", 6), ("texts", 5)):
        (tmp_path / folder).mkdir()
        recs = [{"id": f"{folder}-{i}", "question": f"{folder}: what is {i} plus {i + 1}?", "mode": "spec",
                 "text": f"It is {2 * i + 1}. " * (4 + 3 * (folder == "texts")), "stop_reason": "stop"}
                for i in range(n)]
        (tmp_path / folder / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    gen = [str(tmp_path / "chat" / "answers.jsonl"), str(tmp_path / "texts" / "answers.jsonl")]
    base = ["--target", str(root / "t"), "--data-file", str(root / "train.jsonl"), "--heldout", str(HELDOUT)]
    train, held, held_self, groups = train_draft_head.load_sequences(
        train_draft_head.parse_args(base + ["--generated", *gen, "--heldout-generated", "2"]), tok)
    assert groups == ["chat", "chat", "texts", "texts"]
    questions = [tok.decode(s.ids[:s.n_prompt]) for s in held_self]
    assert "chat: what is 5 plus 6?" in questions[1] and "texts: what is 4 plus 5?" in questions[3]
    assert sum(s.source == "answers.jsonl" for s in train) == 4 + 3
    out = _train(root, "heldfolders", "--max-steps", "2", "--heldout-generated", "2", "--generated", *gen)
    g = json.loads((out / "report.json").read_text())["evals"][-1]["generated"]
    by = g["by_folder"]
    assert set(by) == {"chat", "texts"} and g["tokens"] == by["chat"]["tokens"] + by["texts"]["tokens"]
    pooled = (by["chat"]["top1"] * by["chat"]["tokens"] + by["texts"]["top1"] * by["texts"]["tokens"]) / g["tokens"]
    assert g["top1"] == pytest.approx(pooled, rel=1e-9)


def test_spread_takes_the_last_of_each_equal_stretch():
    assert train_draft_head.spread(list(range(10)), 3) == [2, 5, 9]
    assert train_draft_head.spread(list(range(23147)), 24)[-1] == 23146
    assert len(set(train_draft_head.spread(list(range(50)), 24))) == 24
    assert train_draft_head.spread([1, 2], 5) == [1, 2] and train_draft_head.spread([1, 2], 0) == []


def test_pooled_evaluations_weigh_each_step_by_its_own_positions():
    a = {"loss": 1.0, "top1": 0.5, "tokens": 10, "top1_steps": [0.5, 0.2], "n_steps": [10.0, 8.0]}
    b = {"loss": 3.0, "top1": 1.0, "tokens": 30, "top1_steps": [1.0, 0.6], "n_steps": [30.0, 2.0]}
    p = train_draft_head.pool_evals([a, b])
    assert p["tokens"] == 40 and p["loss"] == pytest.approx(2.5) and p["top1"] == pytest.approx(0.875)
    assert p["top1_steps"] == pytest.approx([0.875, (0.2 * 8 + 0.6 * 2) / 10])


def test_length_groups_take_each_sequence_once_shortest_first_within_the_budget():
    from project.training.features import length_groups

    lengths = [40, 7, 33, 58, 12, 12, 60, 25, 3, 200]
    groups = length_groups(lengths, 150)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    flat = [i for g in groups for i in g]
    assert [lengths[i] for i in flat] == sorted(lengths) and flat.index(4) < flat.index(5)  # ties keep their order
    assert all(len(g) * max(lengths[i] for i in g) <= 150 for g in groups if len(g) > 1)
    assert groups[-1] == [9]  # longer than the budget: a forward of its own
    padded = sum(len(g) * max(lengths[i] for i in g) for g in groups)
    assert padded == 525 and sum(lengths) == 450  # in their own order the same budget pads them to 606
    assert length_groups(lengths, 0) == [[i] for i in range(len(lengths))]


def test_batched_features_equal_one_sequence_a_forward(setup, tmp_path):
    """--feature-batch: sequences of several lengths run together, by length within a window, right-padded, and every
    real position gets the features a forward of its sequence alone gives (float16 on disk, so to float16's
    precision); a time limit that stops between windows leaves a prefix done, and a later call finishes it to the
    same rows. Left padding (a
    position reading padding before it) is shown to differ."""
    from minitorch.models.draft_head import target_fingerprint
    from project.training.data import Sequence_
    from project.training.features import FeatureStore

    model, tok, _, rows = setup
    seqs = [Sequence_(ids=tok.encode(build_prompt(tok, r["question"]))[:n], n_prompt=4, source="test")
            for r, n in zip(rows[:9], (40, 7, 33, 58, 12, 12, 60, 25, 3))]
    assert len({len(s.ids) for s in seqs}) > 5
    fp = target_fingerprint(model)
    one = FeatureStore(tmp_path / "one", seqs, model.config.hidden_size, fp)
    one.extract(model, progress=False)
    many = FeatureStore(tmp_path / "many", seqs, model.config.hidden_size, fp)
    many.extract(model, progress=False, batch_tokens=150, time_limit=0.0, window=4)  # stops after its first window
    assert many.done == 4
    many.extract(model, progress=False, batch_tokens=150, window=4)
    assert many.done == len(seqs)
    for i in range(len(seqs)):
        a, b = np.asarray(one.rows(i), np.float32), np.asarray(many.rows(i), np.float32)
        np.testing.assert_allclose(b, a, rtol=2e-3, atol=2e-3, err_msg=f"sequence {i}")
    # the padding's side matters: a sequence placed after padding reads it
    ids = np.zeros((1, 60), np.int64)
    ids[0, 60 - len(seqs[1].ids):] = seqs[1].ids
    from minitorch import tensor as make_tensor
    _, h = model(make_tensor(ids.tolist(), dtype="int64", backend=model.backend), None, last_n=1, return_hidden=True)
    left = np.asarray(h.to_numpy(), np.float32)[0, 60 - len(seqs[1].ids):]
    assert np.abs(left - np.asarray(one.rows(1), np.float32)).max() > 1e-2


def test_held_out_agreement_counts_the_targets_and_heads_argmax(setup, tmp_path):
    """evaluate()'s top-1 (the argmaxes taken on the backend, only ids copied back) equals the count made on the
    host from the full logits: the head's argmax over its ids against the target's over its whole vocabulary."""
    from minitorch.models.draft_head import DraftHeadConfig, target_fingerprint
    from project.training.data import Sequence_
    from project.training.features import FeatureStore

    model, tok, _, rows = setup
    seqs = [Sequence_(ids=tok.encode(build_prompt(tok, r["question"]))[:n], n_prompt=3, source="test")
            for r, n in zip(rows[:3], (30, 21, 26))]
    store = FeatureStore(tmp_path / "f", seqs, model.config.hidden_size, target_fingerprint(model))
    store.extract(model, progress=False)
    head = DraftHead(DraftHeadConfig.for_target(model, 403, 96), model.backend, seed=4)
    lm_rows = loop.dense_rows(model.lm_head_weight(), 403, model.backend)
    b = loop.build_batch([0, 1, 2], seqs, store, model, lm_rows, model.backend, with_argmax=True)
    nf = np.asarray(b.next_feats.to_numpy(), np.float64)
    target_arg = (nf @ np.asarray(model.lm_head_weight().to_numpy(), np.float64).T).argmax(-1)
    m = np.asarray(b.mask.to_numpy()) > 0
    np.testing.assert_array_equal(b.next_argmax[m], target_arg[m])
    g = np.asarray(head(b.feats, b.emb).to_numpy(), np.float64)
    head_arg = (g @ np.asarray(lm_rows.to_numpy(), np.float64).T).argmax(-1)
    ev = loop.evaluate(head, [[0, 1, 2]], seqs, store, model, lm_rows, 0.1)
    assert ev["tokens"] == m.sum()
    assert ev["top1"] == pytest.approx((head_arg[m] == target_arg[m]).mean())


class OutOfMemoryError(RuntimeError):
    """Named as CuPy's: the trainer tells the GPU's out-of-memory error by its name."""


def test_out_of_gpu_memory_keeps_the_checkpoint_of_the_steps_before(setup, monkeypatch):
    """A step that runs out of GPU memory saves the checkpoint of the steps before it (for --resume) and stops with
    the error; any other error is not taken for it."""
    model, tok, root, rows = setup
    real, calls = loop.train_step, {"n": 0}

    def fails_at(bad):
        def step(*a, **k):
            calls["n"] += 1
            if calls["n"] == bad:
                raise OutOfMemoryError("Out of memory allocating 1,071,775,744 bytes")
            return real(*a, **k)
        return step

    monkeypatch.setattr(loop, "train_step", fails_at(5))  # step 4 (0-based) fails
    with pytest.raises(OutOfMemoryError):
        _train(root, "oom", "--max-steps", "6", "--save-every", "100")
    assert json.loads((root / "oom" / "checkpoint" / "state.json").read_text())["step"] == 4

    def other_error(*a, **k):
        calls["n"] += 1
        raise ValueError("not the GPU's memory")

    calls["n"] = 0
    monkeypatch.setattr(loop, "train_step", other_error)
    with pytest.raises(ValueError):  # any other error is not retried
        _train(root, "other_error", "--max-steps", "6", "--save-every", "100")
    assert calls["n"] == 1 and not (root / "other_error" / "checkpoint").exists()


def test_a_run_from_init_shows_its_batches_in_another_order_than_the_heads_own_run(setup, trained, monkeypatch):
    """The shipped head stopped at 914 of 1,572 batches of its epoch: a run from it with the same batch-order seed
    would first show it those 914 again. A run from --init orders its batches by the seed plus the head's steps."""
    model, tok, root, rows = setup
    head, src = trained
    steps = json.loads((src / "head.json").read_text())["training"]["steps"]
    assert steps > 0
    real, seeds = loop.make_batches, []

    def spy(lengths, tokens_per_step, rng):
        seeds.append(int(rng.bit_generator.seed_seq.entropy))
        return real(lengths, tokens_per_step, rng)

    monkeypatch.setattr(loop, "make_batches", spy)
    _train(root, "order_own", "--max-steps", "1")
    assert steps not in seeds
    seeds.clear()
    _train(root, "order_init", "--init", str(src), "--max-steps", "1")
    assert steps in seeds
