"""Benchmark plots (matplotlib, Agg backend, PNG): throughput and latency per mode, speedup
distribution with predicted-vs-measured, acceptance by draft position and by output position."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

from .runner import mode_key  # noqa: E402
from .summary import THIRDS  # noqa: E402


def _title(summary: Mapping[str, Any]) -> str:
    cfg = summary.get("config", {})
    parts = [str(cfg.get(k)) for k in ("dataset", "target", "drafter") if cfg.get(k)]
    if cfg.get("gamma") is not None:
        parts.append(f"gamma={cfg['gamma']}")
    parts.append(f"{summary['n_problems']} problems")
    return ", ".join(parts)



def _finish(fig, summary: Mapping[str, Any], path: Path) -> Path:
    """The run's title over the figure, saved to path and closed."""
    fig.suptitle(_title(summary), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

def plot_throughput_latency(records: Sequence[Mapping[str, Any]], summary: Mapping[str, Any], path: Path) -> Path:
    """Two panels: tokens/s per problem and latency per problem, a box per mode with the mean marked."""
    modes = sorted(summary["modes"], key=mode_key)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, field, label in ((axes[0], "tokens_per_s", "tokens/s"), (axes[1], "time_s", "latency per problem (s)")):
        data = [[r[field] for r in records if r["mode"] == m] for m in modes]
        ax.boxplot(data, showmeans=True)
        ax.set_xticks(range(1, len(modes) + 1), modes)
        for i, d in enumerate(data, 1):
            ax.scatter([i] * len(d), d, s=8, alpha=0.4, color="gray")
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_title("throughput per mode")
    axes[1].set_title("latency per mode")
    return _finish(fig, summary, path)


def plot_speedup(summary: Mapping[str, Any], path: Path) -> Path | None:
    """Histogram of per-problem speedup (aggregate and 95% CI marked); predicted vs measured beside it."""
    comps = [c for c in summary["comparisons"] if c["per_problem"]]
    if not comps:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    ax = axes[0]
    for c in comps:
        ax.hist(c["per_problem"], bins=min(30, max(5, len(c["per_problem"]) // 2)), alpha=0.5,
                label=f"{c['fast']}/{c['base']}: {c['speedup']:.2f}x [{c['ci95'][0]:.2f}, {c['ci95'][1]:.2f}]")
    main = comps[0]
    ax.axvline(main["speedup"], color="k", lw=1.5)
    ax.axvspan(main["ci95"][0], main["ci95"][1], color="k", alpha=0.1)
    ax.axvline(1.0, color="r", ls="--", lw=1)
    ax.set_xlabel("speedup per problem (tokens/s ratio)")
    ax.set_ylabel("problems")
    ax.set_title("speedup distribution")
    ax.legend(fontsize=7)
    ax = axes[1]
    pairs = [(p, m) for p, m in zip(main["predicted_per_problem"], main["per_problem"]) if p is not None]
    if pairs:
        pred, meas = zip(*pairs)
        ax.scatter(pred, meas, s=12, alpha=0.6)
        lo, hi = min(pred + meas), max(pred + meas)
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="measured = predicted")
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no predicted speedup recorded", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("predicted speedup (Leviathan et al.)")
    ax.set_ylabel("measured speedup")
    ax.set_title(f"predicted vs measured ({main['fast']}/{main['base']})")
    return _finish(fig, summary, path)


def plot_acceptance(summary: Mapping[str, Any], path: Path) -> Path | None:
    """Acceptance by draft position (bars) and by position in the output (early / middle / late)."""
    spec = {m: s for m, s in summary["modes"].items() if s.get("per_position_acceptance")}
    if not spec:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.8 / len(spec)
    for k, (mode, s) in enumerate(spec.items()):
        pos = s["per_position_acceptance"]
        axes[0].bar([i + 1 + k * width for i in range(len(pos))], pos, width=width, label=mode)
        thirds = s.get("output_acceptance") or {}
        vals = [thirds.get(t) or 0.0 for t in THIRDS]
        axes[1].bar([i + k * width for i in range(3)], vals, width=width, label=mode)
    n_pos = max(len(s["per_position_acceptance"]) for s in spec.values())
    axes[0].set_xticks(range(1, n_pos + 1))
    axes[0].set_xlabel("draft position")
    axes[0].set_ylabel("acceptance (accepted / judged)")
    axes[0].set_title("acceptance by draft position")
    axes[1].set_xticks(range(3), THIRDS)
    axes[1].set_ylabel("alpha (accepted / drafted)")
    axes[1].set_title("acceptance by position in the output")
    if not any(s.get("output_acceptance") for s in spec.values()):
        axes[1].text(1, 0.5, "engine gave no per-round log", ha="center", va="center")
    for ax in axes:
        ax.set_ylim(0, 1.05)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    return _finish(fig, summary, path)


def make_plots(records: Sequence[Mapping[str, Any]], summary: Mapping[str, Any], out_dir: str | Path) -> list[Path]:
    """Write every plot that has data into `out_dir`; returns the PNG paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [plot_throughput_latency(records, summary, out / "throughput_latency.png"),
             plot_speedup(summary, out / "speedup.png"),
             plot_acceptance(summary, out / "acceptance.png")]
    return [p for p in paths if p is not None]
