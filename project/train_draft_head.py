"""Train a draft head for a target model with MiniTorch's own autodiff and Adam (EAGLE-style; see
minitorch/models/draft_head.py), on the CPU or --backend cuda.

    python project/train_draft_head.py                               # the default target, GSM8K train split
    python project/train_draft_head.py --backend cuda --epochs 2     # on a GPU
    python project/train_draft_head.py --resume                      # continue an interrupted run
    python project/run_spec_decoding.py --drafter head               # draft with it (the cache's head)

Steps: (1) the training sequences: GSM8K train problems under the benchmark's chat template, answers cleaned
(project/training/data.py), plus --generated answers the target wrote itself; the last --heldout problems are
held out; (2) the target's features over them, once, on disk (resumable); (3) training with a progress bar,
checkpoints every --save-every steps, held-out loss and top-1 agreement every --eval-every steps; (4) the head
(head.safetensors + head.json naming the target's fingerprint) in --output, default the cache's head folder for
this target, a loss curve (loss.png) and a report (report.json) beside it.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


from project.cli_common import get_backend, run_cli
from project.one_line_parser import OneLineParser
from project.settings import DEFAULT_TARGET, UserError
from project.evaluation.data import DEFAULT_DATA_DIR, data_stem

DEFAULT_DATA = DEFAULT_DATA_DIR / "gsm8k" / "train.jsonl.gz"
TTT_MAX_STEPS = 4  # training/ttt.py's TTT_MAX_STEPS (not imported here: --help stays light)
EVAL_STEPS = 3  # held-out agreement of draft steps 1..max(3, --ttt-steps), with or without the training-time test


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(description="Train a draft head (one decoder layer on the target's features) with "
                      "MiniTorch's autodiff and Adam.")
    g = p.add_argument_group("model")
    g.add_argument("--target", default=DEFAULT_TARGET, help=f"target model the head drafts for (default {DEFAULT_TARGET})")
    g.add_argument("--backend", choices=("cpu", "cuda"), default="cpu", help="where to train (default cpu)")
    g.add_argument("--weights", choices=("auto", "packed", "float32"), default="auto",
                   help="the target's weight form on the CPU (as run_spec_decoding.py; default auto)")
    g.add_argument("--head-vocab", type=int, default=32768,
                   help="the head proposes among the first N token ids (its LM head: the target's first N rows; default 32768)")
    g.add_argument("--intermediate-size", type=int, default=3072,
                   help="the head layer's MLP width (the target's is larger; default 3072)")
    d = p.add_argument_group("data")
    d.add_argument("--data-file", default=str(DEFAULT_DATA), help="GSM8K-format JSONL (question, answer) to train on "
                   "(default data/gsm8k/train.jsonl.gz; evaluation sets are refused)")
    d.add_argument("--generated", nargs="*", default=[], metavar="JSONL",
                   help="benchmark result files of the target run on --data-file's problems: its own answers as more data")
    d.add_argument("--limit", type=int, default=None, help="use only the first N problems of --data-file")
    d.add_argument("--heldout", type=int, default=200, help="hold out the last N problems for evaluation (default 200)")
    d.add_argument("--heldout-generated", type=int, default=24, metavar="N",
                   help="also hold out N distinct own questions of each folder of --generated records that carry "
                   "one (what the target wrote: data/chat, data/selfmath...), spread evenly over its files in order, "
                   "and report the head's agreement on them, by folder too (default 24; 0 = none)")
    d.add_argument("--max-seq-len", type=int, default=640, help="cut sequences to N tokens (default 640)")
    t = p.add_argument_group("training")
    t.add_argument("--epochs", type=float, default=2.0, help="passes over the training sequences (default 2)")
    t.add_argument("--tokens-per-step", type=int, default=4096, help="batch size in tokens, padding included (default 4096)")
    t.add_argument("--lr", type=float, default=1e-3, help="Adam's peak learning rate (default 1e-3)")
    t.add_argument("--warmup", type=int, default=50, help="warm-up steps (default 50)")
    t.add_argument("--ce-weight", type=float, default=0.1, help="weight of the soft cross-entropy (EAGLE: 0.1)")
    t.add_argument("--ttt-steps", type=int, default=1, metavar="K",
                   help="training-time test (EAGLE-3): also train draft steps 2..K on the head's own outputs, as it "
                   "drafts (1..4; default 1: every position reads the target's features)")
    t.add_argument("--precision", choices=("tf32", "fp32"), default="tf32",
                   help="--backend cuda's float32 matrix products (the features' and the head's): tf32 on the tensor "
                   "cores (10-bit mantissa inputs, fp32 sums; default) or fp32 (exact; its products ~5x slower on an "
                   "H200); decoding never uses tf32")
    t.add_argument("--features-by", choices=("model", "decoder"), default="model",
                   help="what computes the target's features: model (default: its float32 forward, tf32 on the GPU) "
                        "or decoder (--backend cuda: the CUDA decoder's bf16 prefill, the kernels a head's features "
                        "come from when it drafts on the GPU; on one H100 at 0.77x the model's tokens a second)")
    t.add_argument("--feature-batch", type=int, default=None, metavar="TOKENS",
                   help="the target's features: sequences a forward, up to TOKENS tokens with padding (default 8192 "
                   "on cuda, 0 = one sequence a forward on the CPU)")
    t.add_argument("--clip", type=float, default=0.5, help="global gradient-norm clip (default 0.5; 0 = off)")
    t.add_argument("--seed", type=int, default=0, help="initialisation and batch-order seed (default 0)")
    t.add_argument("--eval-every", type=int, default=100, help="held-out evaluation every N steps (default 100)")
    t.add_argument("--save-every", type=int, default=100, help="checkpoint every N steps (default 100)")
    t.add_argument("--max-steps", type=int, default=None, help="stop after N steps (default: --epochs decides)")
    t.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="wall-clock budget: the features take at most half of it (training then uses the sequences "
                   "done), the learning rate's decay is paced to end with it, training stops and saves when it is spent")
    o = p.add_argument_group("output")
    o.add_argument("--output", default=None, help="folder for the head (default: the cache's heads/<target fingerprint>)")
    o.add_argument("--resume", action="store_true", help="continue the checkpoint in --output")
    o.add_argument("--features", default=None, metavar="DIR",
                   help="folder for the target's features (default OUTPUT/features); a folder an earlier run filled "
                   "is reused where the target and the sequences are the same (else extracted afresh), e.g. to go on "
                   "with --init into a new --output without paying for the features again")
    o.add_argument("--features-only", action="store_true",
                   help="extract the target's features (into --features) and stop: on a machine whose calls are "
                   "time-limited, one call fills the folder (--time-limit is then all theirs) and the next trains")
    o.add_argument("--init", default=None, metavar="DIR",
                   help="start from a saved head for this target (its weights and shapes; a fresh optimizer and "
                   "schedule; batches in another order than its own run's: the seed plus the steps it had), e.g. to go "
                   "on training it on more data; head.json records it")
    o.add_argument("--save-dtype", choices=("float16", "float32", "int8", "int4"), default="float16",
                   help="the saved head's weights (default float16: half the file; int8 / int4 with float16 scales: a "
                   "quarter / an eighth, for shipping; drafting stays exact either way)")
    o.add_argument("--no-plot", action="store_true", help="skip loss.png")
    o.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    for name in ("head_vocab", "intermediate_size", "tokens_per_step", "max_seq_len", "eval_every", "save_every"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not 1 <= args.ttt_steps <= TTT_MAX_STEPS:
        raise UserError(f"--ttt-steps must be in 1..{TTT_MAX_STEPS}, got {args.ttt_steps}")
    if args.epochs <= 0 or args.lr <= 0:
        raise UserError("--epochs and --lr must be > 0")
    if args.features_by == "decoder" and args.backend != "cuda":
        raise UserError("--features-by decoder runs the CUDA decoder: it needs --backend cuda")
    return args


def spread(items: list, n: int) -> list:
    """n of items evenly over them in order: the last of each of n equal stretches (all of them when n >= len)."""
    if n <= 0:
        return []
    if n >= len(items):
        return list(items)
    return [items[(j + 1) * len(items) // n - 1] for j in range(n)]


def load_sequences(args: argparse.Namespace, tok):
    from project.training.data import generated_sequences, gsm8k_sequences, read_rows, split_heldout

    rows = read_rows(args.data_file)
    if args.limit is not None:
        rows = rows[:args.limit]
    seqs = gsm8k_sequences(tok, rows, args.max_seq_len, source=Path(args.data_file).name)
    if not seqs:
        raise UserError(f"{args.data_file}: no usable problems")
    train, held = split_heldout(seqs, min(args.heldout, len(seqs) - 1))
    held_questions = {r["question"] for r in rows[len(rows) - len(held):]} if held else set()
    stem = data_stem(args.data_file)  # the benchmark's problem ids for --data-file rows: <stem>-<row>
    questions = {(f"{stem}-{r['id']}" if r.get("id") is not None else f"{stem}-{i}"): r["question"]
                 for i, r in enumerate(rows)}
    files = [(name, [r for r in read_rows(name) if questions.get(str(r.get("id"))) not in held_questions])
             for name in args.generated]
    # --heldout-generated distinct own questions of each folder of --generated files (data/chat, data/selfmath, a
    # machine's /root/texts: each kind of text the target wrote), spread evenly over the folder's files in order (the
    # last of each of N equal stretches: data/chat's files hold one style after the other, so its last 24 were all
    # Magpie requests, 14 with code, where its topics cover every Spec-Bench category), are held out, in every file
    # they appear in, and reported by folder
    own: dict[str, list[str]] = {}
    for name, rows_g in files:
        own.setdefault(Path(name).parent.name, []).extend(
            r["question"] for r in rows_g if isinstance(r.get("question"), str))
    group_of: dict[str, str] = {}  # a held-out question -> its folder
    for group, qs in own.items():
        for q in spread(list(dict.fromkeys(qs)), args.heldout_generated):
            group_of.setdefault(q, group)
    generated, held_gen, held_groups, seen = [], [], [], set()
    for name, rows_g in files:
        src = Path(name).name
        generated += generated_sequences(tok, [r for r in rows_g if r.get("question") not in group_of], questions,
                                         args.max_seq_len, source=src, seen=seen)
        by_group: dict[str, list] = {}  # this file's held-out rows by their question's folder
        for r in rows_g:
            if r.get("question") in group_of:
                by_group.setdefault(group_of[r["question"]], []).append(r)
        for group, rows_h in by_group.items():
            s = generated_sequences(tok, rows_h, questions, args.max_seq_len, source=src, seen=seen)
            held_gen += s
            held_groups += [group] * len(s)
    # The target's own answers first: under --time-limit the features are extracted in this order, and the
    # text the target writes itself is the data that matters most for acceptance
    return generated + train, held, held_gen, held_groups


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import numpy as np

    from minitorch import Adam
    from minitorch.models import cache_root, load_model
    from minitorch.models.draft_head import DraftHead, DraftHeadConfig, target_fingerprint
    from minitorch.models.head_io import load_head, save_head
    from project.training.data import answer_spans
    from project.training.features import FeatureStore
    from project.training.loop import (TrainState, build_batch, dense_rows, evaluate, gpu_pool_line,
                                       is_out_of_memory, load_checkpoint, lr_at, make_batches, save_checkpoint,
                                       time_bounded_total, train_step)
    from project.training.objective import ttt_weights

    backend = get_backend(args.backend)
    if args.backend == "cuda":
        from minitorch.cuda.blas import set_tf32

        set_tf32(args.precision == "tf32")
    target, tok = load_model(args.target, backend=backend, progress=not args.quiet, weights=args.weights)
    fp = target_fingerprint(target)
    out = Path(args.output) if args.output else cache_root() / "heads" / fp
    if (out / "checkpoint").exists() and not args.resume:
        raise UserError(f"{out} already holds a training checkpoint; pass --resume to continue it or --output elsewhere")
    if args.resume and not (out / "checkpoint").exists():
        raise UserError(f"--resume: no checkpoint in {out}")
    n_vocab = min(args.head_vocab, target.config.vocab_size)
    if args.init:
        head = load_head(args.init, target, backend)  # checks it was trained for this target
        for _, p in head.named_parameters():
            p.requires_grad = True
            p.value.requires_grad_(True)
        cfg, init = head.config, {"from": str(args.init), "training": head.config.training}
        n_vocab = cfg.head_vocab
        print(f"--init: starting from {args.init} (head vocabulary {cfg.head_vocab}, MLP {cfg.intermediate_size}; "
              f"{(init['training'] or {}).get('steps', '?')} steps before)")
    else:
        cfg = DraftHeadConfig.for_target(target, n_vocab, args.intermediate_size, name=str(args.target))
        head, init = DraftHead(cfg, backend, seed=args.seed), None
    train, held_main, held_gen, held_groups = load_sequences(args, tok)
    held = held_main + held_gen
    t0 = time.perf_counter()
    seqs = held + train  # held-out first: a time-limited extraction always has them
    # the features' maker is part of their key: a folder of the other kind's is computed afresh, never mixed
    store = FeatureStore(Path(args.features) if args.features else out / "features", seqs, target.config.hidden_size,
                         fp if args.features_by == "model" else f"{fp}|decoder-bf16")
    feature_batch = args.feature_batch if args.feature_batch is not None else (8192 if args.backend == "cuda" else 0)
    share = 1.0 if args.features_only else 0.5
    rows_of = None
    if args.features_by == "decoder" and store.done < len(seqs):
        from minitorch.cuda.decoder import CudaDecoder
        from project.training.features import DecoderRows

        longest = max(len(s.ids) for s in seqs)
        rows_of = DecoderRows(CudaDecoder.from_model(target, max_len=longest + 128, max_tokens=128))
    store.extract(target, progress=not args.quiet, time_limit=args.time_limit * share if args.time_limit else None,
                  batch_tokens=feature_batch, rows_of=rows_of)
    del rows_of  # the decoder's bf16 weights and cache go before training
    t_feat = time.perf_counter() - t0
    if args.features_only:
        print(f"features: {store.done} of {len(seqs)} sequences ({int(store.offsets[store.done])} of "
              f"{int(store.offsets[-1])} tokens) in {store.folder}, {t_feat:.1f} s this run")
        return 0
    if store.done < len(seqs):
        if store.done <= len(held):
            raise UserError(f"--time-limit: the target's features of only {store.done} sequences were done; "
                            "allow more time or fewer problems (--limit)")
        print(f"--time-limit: training on the {store.done - len(held)} of {len(train)} sequences whose features are "
              "done (rerun with --resume to extract the rest)")
        train = train[:store.done - len(held)]

    opt = Adam(head.parameters(), lr=args.lr)
    state = load_checkpoint(out, head, opt) if args.resume else TrainState()
    lm_rows = dense_rows(target.lm_head_weight(), n_vocab, backend)
    lengths = [len(s.ids) for s in train]
    per_epoch = len(make_batches(lengths, args.tokens_per_step, np.random.default_rng(0)))
    n_tokens = sum(lengths)
    total = args.max_steps or int(round(args.epochs * per_epoch))
    n_main = len(held_main)  # store order: GSM8K's held out, the self-written held out, then training
    held_batches = make_batches([len(s.ids) for s in held_main], args.tokens_per_step, np.random.default_rng(0))
    gen_batches = {}  # folder -> batches of its held-out sequences (store indices)
    for group in dict.fromkeys(held_groups):
        idx = [n_main + i for i, g in enumerate(held_groups) if g == group]
        gen_batches[group] = [[idx[i] for i in b] for b in make_batches(
            [len(seqs[i].ids) for i in idx], args.tokens_per_step, np.random.default_rng(0))]

    def evaluate_all() -> dict:
        ev = evaluate(head, held_batches, seqs, store, target, lm_rows, args.ce_weight, eval_steps)
        if gen_batches:
            by = {g: evaluate(head, b, seqs, store, target, lm_rows, args.ce_weight, eval_steps)
                  for g, b in gen_batches.items()}
            ev["generated"] = pool_evals(list(by.values()))
            if len(by) > 1:
                ev["generated"]["by_folder"] = {g: {k: e[k] for k in ("top1", "top1_steps", "tokens") if k in e}
                                                for g, e in by.items()}
        return ev
    print(f"training sequences: {len(train)} ({n_tokens} tokens, "
          f"{sum(b - a for s in train for a, b in answer_spans(s))} answer tokens), held out: {n_main}{f' + {len(held_gen)} self-written' if held_gen else ''}; "
          f"{per_epoch} steps an epoch, {total} steps; features {t_feat:.1f} s; head -> {out}")

    eval_steps = max(EVAL_STEPS, args.ttt_steps)

    from tqdm import tqdm

    bar = tqdm(total=total, initial=state.step, desc="train", unit="step", disable=args.quiet)
    t1 = time.perf_counter()
    # with --time-limit the schedule ends when the time does (time_bounded_total): what is left after the features
    budget = args.time_limit - (t1 - t0) if args.time_limit else None
    start_step = state.step
    if init and held_batches and not state.evals:  # the head it starts from, on the same held-out text: the gain
        ev = evaluate_all()
        state.evals.append({"step": 0, **ev})
        bar.write(f"step 0 (--init): held-out loss {ev['loss']:.4f}, top-1 agreement {ev['top1']:.3f} "
                  f"(draft steps {_fmt(ev['top1_steps'])})" + _fmt_generated(ev))
    # a run from --init orders its batches by another seed than the run that made the head: with the same one, a head
    # cut off part-way through its epoch (the shipped one saw 914 of 1,572 batches) is shown those batches again first
    order_seed = args.seed + (int((init["training"] or {}).get("steps", 0)) if init else 0)
    tokens_done = 0
    out_of_time = False
    while state.step < total and not out_of_time:
        batches = make_batches(lengths, args.tokens_per_step, np.random.default_rng(order_seed + state.epoch))
        batches = [[len(held) + i for i in b] for b in batches]  # store order: held out first
        while state.batch_in_epoch < len(batches) and state.step < total:
            idx = batches[state.batch_in_epoch]
            batch = build_batch(idx, seqs, store, target, lm_rows, backend)
            sched = total if budget is None else time_bounded_total(total, start_step, state.step,
                                                                    time.perf_counter() - t1, budget)
            opt.lr = lr_at(state.step, sched, args.lr, args.warmup)
            try:
                rec = train_step(head, opt, batch, lm_rows, args.ce_weight, args.clip, args.ttt_steps)
            except Exception as err:
                if is_out_of_memory(err):  # keep what was trained (--resume goes on from here; TOKENS: smaller steps)
                    bar.write(f"step {state.step}: out of GPU memory{gpu_pool_line(backend)}; checkpoint saved")
                    save_checkpoint(out, head, opt, state)
                raise
            rec["lr"] = opt.lr
            state.history.append(rec)
            state.step += 1
            state.batch_in_epoch += 1
            tokens_done += sum(len(seqs[i].ids) for i in idx)
            bar.update(1)
            bar.set_postfix(loss=f"{rec['loss']:.3f}", ce=f"{rec['ce']:.3f}")
            if held_batches and (state.step % args.eval_every == 0 or state.step == total):
                ev = evaluate_all()
                state.evals.append({"step": state.step, **ev})
                bar.write(f"step {state.step}: held-out loss {ev['loss']:.4f}, top-1 agreement {ev['top1']:.3f} "
                          f"(draft steps {_fmt(ev['top1_steps'])})" + _fmt_generated(ev) + gpu_pool_line(backend))
            if state.step % args.save_every == 0:
                save_checkpoint(out, head, opt, state)
            if args.time_limit and time.perf_counter() - t0 > args.time_limit:
                bar.write(f"--time-limit: stopping at step {state.step} of {total}")
                out_of_time = True
                break
        if not out_of_time and state.batch_in_epoch >= len(batches):
            state.epoch += 1
            state.batch_in_epoch = 0
    bar.close()
    t_train = time.perf_counter() - t1
    if held_batches and (not state.evals or state.evals[-1]["step"] != state.step):
        state.evals.append({"step": state.step, **evaluate_all()})
    save_checkpoint(out, head, opt, state)
    cfg.training = {"data": [Path(args.data_file).name, *[Path(g).name for g in args.generated]],
                    "sequences": len(train), "tokens": n_tokens, "steps": state.step, "epochs": args.epochs,
                    "lr": args.lr, "tokens_per_step": args.tokens_per_step, "backend": args.backend,
                    "ttt_steps": args.ttt_steps, "ttt_weights": ttt_weights(args.ttt_steps),
                    "train_seconds_this_run": round(t_train, 1), "feature_seconds": round(t_feat, 1),
                    "heldout": state.evals[-1] if state.evals else None}
    if init:
        cfg.training["init"] = init
    save_head(head, out, args.save_dtype)
    report = {"head": str(out), "target": str(args.target), "fingerprint": fp, **cfg.training,
              "tokens_per_s": round(tokens_done / max(t_train, 1e-9), 1), "evals": state.evals}
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    if not args.no_plot:
        plot_losses(state, out / "loss.png")
    last = state.evals[-1] if state.evals else {}
    print(f"head saved to {out} ({state.step} steps, {t_train:.1f} s, {report['tokens_per_s']} tokens/s); "
          f"held-out top-1 agreement {last.get('top1', float('nan')):.3f}"
          f"{' (draft steps ' + _fmt(last['top1_steps']) + ')' if 'top1_steps' in last else ''}, "
          f"loss {last.get('loss', float('nan')):.4f}{_fmt_generated(last)}")
    return 0


def _fmt(xs) -> str:
    return " ".join(f"{x:.3f}" for x in xs)


def pool_evals(evs: list[dict]) -> dict:
    """The evaluation of several held-out sets as one: their losses and agreements weighted by the positions each
    counted (a draft step's own count: training/loop.py evaluate's n_steps)."""
    n = [sum(e["n_steps"][j] for e in evs) for j in range(len(evs[0]["n_steps"]))]
    out = {"loss": sum(e["loss"] * e["n_steps"][0] for e in evs) / max(n[0], 1.0),
           "top1": sum(e["top1"] * e["n_steps"][0] for e in evs) / max(n[0], 1.0),
           "tokens": int(sum(e["tokens"] for e in evs))}
    if "top1_steps" in evs[0]:
        out["top1_steps"] = [float(sum(e["top1_steps"][j] * e["n_steps"][j] for e in evs) / max(n[j], 1.0))
                             for j in range(len(n))]
    return out


def _fmt_generated(ev: dict) -> str:
    g = ev.get("generated")
    if not g:
        return ""
    by = "".join(f"; {name} {e['top1']:.3f}" for name, e in g.get("by_folder", {}).items())
    return f"; self-written held out: top-1 {g['top1']:.3f} (draft steps {_fmt(g['top1_steps'])}){by}"


def plot_losses(state, path: Path) -> None:
    """Training loss per step and held-out loss / agreement per evaluation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
    ax[0].plot([h["loss"] for h in state.history], lw=0.8, label="train")
    if state.evals:
        ax[0].plot([e["step"] for e in state.evals], [e["loss"] for e in state.evals], "o-", label="held out")
        steps = [e["step"] for e in state.evals]
        n = min(len(e.get("top1_steps", [e["top1"]])) for e in state.evals)
        for j in range(n):
            ax[1].plot(steps, [e.get("top1_steps", [e["top1"]])[j] for e in state.evals], "o-", label=f"draft {j + 1}")
        ax[1].legend()
    ax[0].set(xlabel="step", ylabel="loss", title="SmoothL1 + 0.1 x soft CE")
    ax[0].legend()
    ax[1].set(xlabel="step", ylabel="top-1 agreement", title="held out: head's draft j = target's token")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    run_cli(main)
