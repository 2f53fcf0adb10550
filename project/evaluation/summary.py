"""Benchmark summary: accuracy, throughput, speedup with a bootstrap interval, acceptance; table, JSON, plots.

Definitions used here:
- tokens/s of one generation = generated tokens / wall seconds of the generation call (prefill included). With
  --batch N (config "batch") the seconds are the sequence's own from its admission to its end, every step shared
  with up to N - 1 other sequences: a per-sequence rate, not comparable to a run of one sequence at a time.
- speedup of mode A over mode B = aggregate throughput ratio over the problems both ran,
  (sum tokens_A / sum seconds_A) / (sum tokens_B / sum seconds_B); its 95% interval is a percentile
  bootstrap over problems (pairs resampled together). The per-problem ratio is plotted too.
- alpha = sum accepted / sum drafted over all problems; tau = sum new tokens / sum target forwards.
- acceptance by draft position i = sum accepted_i / sum judged_i (a position is judged when every
  earlier draft in its round was accepted); by output position: alpha in the early / middle / late
  third of each output, pooled over problems.
- time split of a mode = the engine's timers summed over problems (stats time_prefill, time_draft, time_verify,
  time_sample; on the GPU draft / verify are device time between events) over the summed wall seconds; "other"
  is the rest (host work between steps or rounds).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .runner import mode_key, thirds_counts

from minitorch.generation.stats import cost_model_speedup

COMPARISONS = (("spec", "target"), ("hf_assisted", "hf_greedy"), ("spec", "hf_greedy"), ("target", "hf_greedy"))
THIRDS = ("early", "middle", "late")
TIMERS = ("prefill", "draft", "verify", "sample")  # the engine's timers (stats time_<name>), in table order
TIMER_LABELS = {"prefill": "prefill", "draft": "draft steps", "verify": "target steps", "sample": "sampling",
                "other": "other"}  # "verify" times every target forward: verify steps, or decode steps alone


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _mode_summary(rs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Accuracy, speed and (for speculative modes) acceptance of one mode's records."""
    tps = [r["tokens_per_s"] for r in rs]
    lat = [r["time_s"] for r in rs]
    toks = sum(r["generated_tokens"] for r in rs)
    secs = sum(lat)
    extraction: dict[str, int] = {}
    for r in rs:
        extraction[r["extraction"]] = extraction.get(r["extraction"], 0) + 1
    graded = [r for r in rs if r["correct"] is not None]  # a conversation (Spec-Bench) is not graded
    out: dict[str, Any] = {
        "n": len(rs),
        "correct": sum(bool(r["correct"]) for r in graded),
        "accuracy": sum(bool(r["correct"]) for r in graded) / len(graded) if graded else None,
        "truncated": sum(bool(r["truncated"]) for r in rs),
        "extraction": extraction,
        "mean_tokens_per_s": statistics.fmean(tps),
        "median_tokens_per_s": statistics.median(tps),
        "aggregate_tokens_per_s": _ratio(toks, secs),
        "mean_latency_s": statistics.fmean(lat),
        "median_latency_s": statistics.median(lat),
        "mean_generated_tokens": toks / len(rs),
    }
    split = _time_split(rs, secs)
    if split is not None:
        out["time_split"] = split
    spec = [r for r in rs if r.get("alpha") is not None]
    if spec:
        st = [r.get("stats") or {} for r in spec]
        drafted = sum(s.get("drafted", 0) for s in st)
        out["alpha"] = _ratio(sum(s.get("accepted", 0) for s in st), drafted)
        forwards = sum(s.get("target_forwards", 0) for s in st)
        out["tau"] = _ratio(sum(s.get("new_tokens", r["generated_tokens"]) for s, r in zip(st, spec)), forwards)
        taus = [r["tau"] for r in spec if r.get("tau") is not None]
        if out["tau"] is None and taus:  # no forward counts recorded: mean of the per-problem values
            out["tau"] = statistics.fmean(taus)
        out["per_position_acceptance"] = _pool_positions(spec)
        out["output_acceptance"] = _pool_thirds(spec)
        pred = [r["predicted_speedup"] for r in spec if r.get("predicted_speedup") is not None]
        out["predicted_speedup"] = statistics.fmean(pred) if pred else None
    return out


def _time_split(rs: Sequence[Mapping[str, Any]], secs: float) -> dict[str, float] | None:
    """Each engine timer's share of the mode's wall seconds, and "other" (what no timer covers); None when
    the records carry no timers (e.g. transformers baselines)."""
    stats = [r.get("stats") or {} for r in rs]
    if not secs or not any(f"time_{t}" in st for st in stats for t in TIMERS):
        return None
    split = {t: sum(st.get(f"time_{t}", 0.0) for st in stats) / secs for t in TIMERS}
    split["other"] = 1.0 - sum(split.values())
    return split


def _pool_positions(rs: Sequence[Mapping[str, Any]]) -> list[float]:
    """Per-draft-position acceptance pooled over problems (weighted by judged counts when known)."""
    acc: list[float] = []
    judged: list[float] = []
    for r in rs:
        rates = r.get("per_position_acceptance") or []
        weights = (r.get("stats") or {}).get("per_position_judged") or [1] * len(rates)
        for i, (p, w) in enumerate(zip(rates, weights)):
            while len(acc) <= i:
                acc.append(0.0)
                judged.append(0.0)
            acc[i] += p * w
            judged[i] += w
    return [a / j if j else 0.0 for a, j in zip(acc, judged)]


def _pool_thirds(rs: Sequence[Mapping[str, Any]]) -> dict[str, float | None] | None:
    """Early / middle / late acceptance pooled over problems from the per-round logs (None if absent)."""
    sums = {t: [0, 0] for t in THIRDS}
    seen = False
    for r in rs:
        counts = thirds_counts(r.get("stats") or {})
        if counts is None:
            continue
        seen = True
        for t, (a, d) in zip(THIRDS, counts):
            sums[t][0] += a
            sums[t][1] += d
    if not seen:
        return None
    return {t: _ratio(a, d) for t, (a, d) in sums.items()}


def _pairs(records: Sequence[Mapping[str, Any]], fast: str, base: str) -> list[tuple[Mapping, Mapping]]:
    by_id = {(r["id"], r["mode"]): r for r in records}
    ids = sorted({r["id"] for r in records if r["mode"] == fast and (r["id"], base) in by_id},
                 key=lambda i: by_id[(i, fast)].get("index", 0))
    return [(by_id[(i, fast)], by_id[(i, base)]) for i in ids]


def bootstrap_speedup(tok_f: np.ndarray, sec_f: np.ndarray, tok_b: np.ndarray, sec_b: np.ndarray,
                      n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Aggregate throughput ratio fast/base and its 95% percentile-bootstrap interval (pairs resampled)."""
    def ratio(idx: np.ndarray) -> np.ndarray:
        return (tok_f[idx].sum(-1) / sec_f[idx].sum(-1)) / (tok_b[idx].sum(-1) / sec_b[idx].sum(-1))

    n = len(tok_f)
    point = float(ratio(np.arange(n)))
    rng = np.random.default_rng(seed)
    samples = ratio(rng.integers(0, n, size=(n_boot, n)))  # (n_boot,)
    lo, hi = np.percentile(samples, [2.5, 97.5])
    return point, float(lo), float(hi)


def _comparison(records: Sequence[Mapping[str, Any]], fast: str, base: str,
                n_boot: int, seed: int) -> dict[str, Any] | None:
    pairs = _pairs(records, fast, base)
    if not pairs:
        return None
    tok_f = np.array([f["generated_tokens"] for f, _ in pairs], dtype=float)
    sec_f = np.array([max(f["time_s"], 1e-12) for f, _ in pairs])
    tok_b = np.array([b["generated_tokens"] for _, b in pairs], dtype=float)
    sec_b = np.array([max(b["time_s"], 1e-12) for _, b in pairs])
    if tok_f.sum() == 0 or tok_b.sum() == 0:
        return None
    point, lo, hi = bootstrap_speedup(tok_f, sec_f, tok_b, sec_b, n_boot, seed)
    kept = [(f["tokens_per_s"] / b["tokens_per_s"], f["id"]) for f, b in pairs if b["tokens_per_s"] > 0]
    predicted = [f.get("predicted_speedup") for f, _ in pairs]
    cost_model = [cost_model_speedup(f.get("stats") or {}, b.get("stats") or {}) for f, b in pairs]
    cost_model = [c for c in cost_model if c is not None]
    out = {
        "fast": fast, "base": base, "n_pairs": len(pairs),
        "speedup": point, "ci95": [lo, hi],
        **_per_problem_figures(kept),
        "per_problem": [x for x, _ in kept],
        "predicted_per_problem": predicted,
        "predicted_mean": statistics.fmean(p for p in predicted if p is not None)
        if any(p is not None for p in predicted) else None,
        "cost_model_mean": statistics.fmean(cost_model) if cost_model else None,
        "identical_outputs": sum(f["text"] == b["text"] for f, b in pairs),
        "same_grade": sum(f["correct"] == b["correct"] for f, b in pairs),
    }
    by_run = _runs_alone(pairs)
    if by_run:
        out["by_run"] = by_run
        out["self_noise"] = {fast: _against_itself([f for f, _ in pairs]), base: _against_itself([b for _, b in pairs])}
    return out


def _against_itself(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """With --repeats: one mode's run 1 against its own run 2 (run 2's seconds over run 1's, the speedup a benchmark
    that timed the same mode twice, once each, would report): the median, lowest and count below 0.95x. The same code
    and the same output, so every problem's true figure is 1.0: what falls below 0.95x here is the machine's noise
    for a one-timing comparison at that threshold."""
    kept = [(r["time_s_runs"][1] / max(r["time_s_runs"][0], 1e-12), r["id"]) for r in records]
    return _per_problem_figures(kept)


def _runs_alone(pairs: Sequence[tuple[Mapping, Mapping]]) -> list[dict[str, Any]]:
    """With --repeats: run k of each mode alone (the k-th timing of both, as a benchmark that timed once would have
    seen it): its median per-problem speedup, lowest and count below 0.95x, for k = 1 .. the fewest runs a pair has.
    [] when a pair lacks time_s_runs. The kept figures pair each mode's median run, which need not be the same run;
    how far the runs alone spread is the machine's noise at this threshold. A run's tokens are taken as the kept
    record's (--repeats checks that every run wrote the same text: repeats_identical)."""
    runs = [(f.get("time_s_runs") or [], b.get("time_s_runs") or []) for f, b in pairs]
    k_max = min((min(len(a), len(b)) for a, b in runs), default=0)
    if k_max < 2:
        return []
    out = []
    for k in range(k_max):
        kept = [((f["generated_tokens"] / max(a[k], 1e-12)) / (b["generated_tokens"] / max(c[k], 1e-12)), f["id"])
                for (f, b), (a, c) in zip(pairs, runs) if b["generated_tokens"] > 0]
        out.append({"run": k + 1, **_per_problem_figures(kept)})
    return out


def _per_problem_figures(kept: Sequence[tuple[float, Any]]) -> dict[str, Any]:
    """From (speedup, id) a problem: the median and lowest speedup, how many problems ran below 0.95x (issue 43's
    floor) and which (`below_095_ids`: [id, speedup] pairs, slowest first)."""
    per = [x for x, _ in kept]
    below = sorted(((x, i) for x, i in kept if x < 0.95), key=lambda b: b[0])
    return {"median_per_problem": statistics.median(per) if per else None,
            "lowest_per_problem": min(per) if per else None,
            "below_095": len(below), "below_095_ids": [[i, x] for x, i in below]}


def summarize(records: Sequence[Mapping[str, Any]], n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """The summary dict (written as JSON) of a list of result records."""
    if not records:
        raise ValueError("no results to summarize")
    modes = sorted({r["mode"] for r in records}, key=mode_key)
    summary: dict[str, Any] = {
        "n_problems": len({r["id"] for r in records}),
        "config": records[0].get("config", {}),
        "modes": {m: _mode_summary([r for r in records if r["mode"] == m]) for m in modes},
        "comparisons": [],
    }
    for fast, base in COMPARISONS:
        if fast in modes and base in modes:
            comp = _comparison(records, fast, base, n_boot, seed)
            if comp is not None:
                summary["comparisons"].append(comp)
    runs = [r["time_s_runs"] for r in records if len(r.get("time_s_runs") or []) > 1]
    if runs:  # --repeats: how far apart a generation's runs were
        spreads = [max(t) / max(min(t), 1e-12) for t in runs]
        summary["repeats"] = {"runs": max(len(t) for t in runs), "median_spread": statistics.median(spreads),
                              "max_spread": max(spreads)}
    categories = list(dict.fromkeys(r["category"] for r in records if r.get("category") is not None))
    if categories:
        summary["categories"] = {c: _category(records, c, n_boot, seed) for c in categories}
    return summary


def _category(records: Sequence[Mapping[str, Any]], category: str, n_boot: int, seed: int) -> dict[str, Any]:
    """One category's problems (Spec-Bench): count, each mode's tokens/s, tau and alpha, and the speedup of each
    comparison whose two modes ran there."""
    rs = [r for r in records if r.get("category") == category]
    modes = sorted({r["mode"] for r in rs}, key=mode_key)
    out: dict[str, Any] = {"n": len({r["id"] for r in rs}), "modes": {}}
    for m in modes:
        ms = _mode_summary([r for r in rs if r["mode"] == m])
        out["modes"][m] = {k: ms.get(k) for k in ("aggregate_tokens_per_s", "mean_generated_tokens", "tau", "alpha",
                                                   "per_position_acceptance")}
    out["comparisons"] = [c for f, b in COMPARISONS if f in modes and b in modes
                          for c in [_comparison(rs, f, b, n_boot, seed)] if c is not None]
    for c in out["comparisons"]:
        for key in ("per_problem", "predicted_per_problem", "by_run", "self_noise"):
            c.pop(key, None)
    return out


def _named(figures: Mapping[str, Any], most: int = 10) -> str:
    """': id 0.912x, ...' for the problems below 0.95x (the first `most`, slowest first), '' when none."""
    below = figures.get("below_095_ids") or []
    if not below:
        return ""
    more = f", {len(below) - most} more" if len(below) > most else ""
    return ": " + ", ".join(f"{i} {x:.3f}x" for i, x in below[:most]) + more


def _fmt(x: Any, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def format_table(summary: Mapping[str, Any]) -> str:
    """A fixed-width text table of the summary (one row per mode, then the speedups)."""
    head = f"{'mode':<12}{'n':>5}{'acc':>7}{'trunc':>6}{'mean tok/s':>11}{'med tok/s':>10}" \
           f"{'mean lat s':>11}{'alpha':>7}{'tau':>6}"
    lines = [head, "-" * len(head)]
    for mode, m in summary["modes"].items():
        lines.append(f"{mode:<12}{m['n']:>5}{_fmt(m['accuracy'], '.3f'):>7}{m['truncated']:>6}"
                     f"{m['mean_tokens_per_s']:>11.2f}{m['median_tokens_per_s']:>10.2f}"
                     f"{m['mean_latency_s']:>11.4g}{_fmt(m.get('alpha')):>7}{_fmt(m.get('tau')):>6}")
    batch = (summary.get("config") or {}).get("batch", 1)
    if batch > 1:
        lines.append(f"--batch {batch}: the target decoded {batch} sequences at once; a problem's tok/s and latency "
                     "are its own sequence's, sharing every step with the others: not comparable to a run of one at a "
                     f"time (while the batch is full it writes about {batch}x that many tokens/s in all)")
    for c in summary["comparisons"]:
        lo, hi = c["ci95"]
        lines.append(f"speedup {c['fast']} / {c['base']}: {c['speedup']:.2f}x (95% CI {lo:.2f}-{hi:.2f}, "
                     f"{c['n_pairs']} problems; median per problem {_fmt(c['median_per_problem'])}x; "
                     f"predicted {_fmt(c['predicted_mean'])}x, cost model with measured forwards "
                     f"{_fmt(c.get('cost_model_mean'))}x); identical outputs "
                     f"{c['identical_outputs']}/{c['n_pairs']}, same grade {c['same_grade']}/{c['n_pairs']}")
        if c.get("lowest_per_problem") is not None:
            lines.append(f"per problem {c['fast']} / {c['base']}: lowest {c['lowest_per_problem']:.3f}x, "
                         f"{c['below_095']} of {len(c['per_problem'])} below 0.95x{_named(c)}")
        if c.get("by_run"):
            lines.append("each run alone (run k of both modes): " + "; ".join(
                f"run {r['run']} median {r['median_per_problem']:.2f}x, {r['below_095']} below 0.95x (lowest "
                f"{r['lowest_per_problem']:.3f}x){_named(r)}" for r in c["by_run"]))
        if c.get("self_noise"):
            lines.append("each mode against itself (its run 1 against its run 2, one timing each: the true figure is "
                         "1.00x, so what falls below 0.95x is the machine's noise): " + "; ".join(
                             f"{m} {r['below_095']} of {len(c['per_problem'])} below 0.95x (lowest "
                             f"{r['lowest_per_problem']:.3f}x)" for m, r in c["self_noise"].items()))
    spread = summary.get("repeats")
    if spread:
        lines.append(f"timing: each generation run {spread['runs']} times, its median run kept (of an even count the "
                     f"faster of the middle two); slowest over fastest "
                     f"run of a generation: median {spread['median_spread']:.3f}, largest {spread['max_spread']:.3f}")
    for mode, m in summary["modes"].items():
        split = m.get("time_split")
        if split:
            parts = ", ".join(f"{TIMER_LABELS[t]} {100 * split[t]:.1f}%" for t in TIMERS + ("other",)
                              if split[t] or t == "other")
            lines.append(f"{mode} time: {parts}")
    if summary.get("categories"):
        lines.append(f"{'category':<16}{'n':>4}{'speedup':>9}{'95% CI':>13}{'tau':>6}{'alpha':>7}{'spec tok/s':>11}"
                     f"{'identical':>10}")
        for cat, c in summary["categories"].items():
            comp = next((x for x in c["comparisons"] if (x["fast"], x["base"]) == ("spec", "target")), None)
            spec = c["modes"].get("spec", {})
            ci = f"{comp['ci95'][0]:.2f}-{comp['ci95'][1]:.2f}" if comp else "-"
            lines.append(f"{cat:<16}{c['n']:>4}{_fmt(comp and comp['speedup']):>9}{ci:>13}{_fmt(spec.get('tau')):>6}"
                         f"{_fmt(spec.get('alpha')):>7}{_fmt(spec.get('aggregate_tokens_per_s'), '.1f'):>11}"
                         f"{(str(comp['identical_outputs']) + '/' + str(comp['n_pairs'])) if comp else '-':>10}")
    for mode, m in summary["modes"].items():
        if m.get("per_position_acceptance"):
            pos = " ".join(f"{p:.2f}" for p in m["per_position_acceptance"])
            line = f"{mode} acceptance by draft position: {pos}"
            thirds = m.get("output_acceptance")
            if thirds:
                line += "; by output position " + " ".join(f"{t} {_fmt(thirds[t])}" for t in THIRDS)
            lines.append(line)
    return "\n".join(lines)


def write_summary(summary: Mapping[str, Any], path: str | Path) -> Path:
    """Write the summary as indented JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return path
