"""Figure 5-style plots of one benchmark run (paper §4.2): per-request latency over time for every system, then one
panel per system with fine-tuning (orange, hatched) stacked under inference (blue) token throughput, the total as a
black 3 s rolling mean, and the rolling SLO attainment (purple, right axis) against a dotted 95 % line.

Needs matplotlib (the ``bench`` extra); :func:`plot_figure5` raises ImportError without it and the runner says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import family

__all__ = ["plot_figure5", "shrink_png"]

_COLORS = {"bare": "#7f7f7f", "deltaserve": "#d62728", "paper_rule": "#e377c2", "idle_only": "#ff7f0e", "no_interrupt": "#8c564b",
           "llmstation": "#2ca02c", "split_pool": "#1f77b4", "static_mps": "#17becf"}


def _rolling(xs: Sequence[float], k: int) -> list[float]:
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= k:
            acc -= xs[i - k]
        out.append(acc / min(i + 1, k))
    return out


def plot_figure5(result: Mapping[str, Any], runs: Mapping[str, Any], path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = list(result["systems"])
    n = len(systems)
    fig, axes = plt.subplots(1, n + 1, figsize=(4.2 * (n + 1), 3.6), squeeze=False)
    ax0 = axes[0][0]
    for name in systems:
        reqs = runs[name].requests
        s = result["systems"][name]
        ax0.scatter([r.arrival_s for r in reqs], [r.e2e_s for r in reqs], s=5, alpha=0.6,
                    color=None if "@" in name else _COLORS.get(family(name)),
                    label=f"{name} (avg {s['mean_e2e_s']:.2f}s)")
    ax0.set_xlabel("arrival time (s)")
    ax0.set_ylabel("end-to-end latency (s)")
    ax0.set_title(f"{result['trace']['name']}: per-request latency", fontsize=9)
    ax0.legend(fontsize=6, loc="upper right")
    top = max((max(result["timelines"][s]["ft_tok_s"], default=0) + max(result["timelines"][s]["inference_tok_s"],
                                                                         default=0)) for s in systems) or 1.0
    for i, name in enumerate(systems):
        ax = axes[0][i + 1]
        tl = result["timelines"][name]
        t, ft, inf = tl["t"], tl["ft_tok_s"], tl["inference_tok_s"]
        ax.fill_between(t, 0, ft, step="post", facecolor="none", edgecolor="#ff7f0e", hatch="///", linewidth=0.0,
                        label="fine-tuning")
        ax.fill_between(t, ft, [a + b for a, b in zip(ft, inf)], step="post", color="#1f77b4", alpha=0.55,
                        label="inference")
        ax.plot(t, _rolling([a + b for a, b in zip(ft, inf)], 3), color="black", linewidth=0.9, label="total (3 s)")
        ax.set_ylim(0, top * 1.1)
        ax.set_xlabel("time (s)")
        if i == 0:
            ax.set_ylabel("tokens/s")
        s = result["systems"][name]
        slo = s["slo_attainment"]
        ax.set_title(f"{name}\nFT {s['finetune_tokens_per_s']:.0f} tok/s, total "
                     f"{s['finetune_tokens_per_s'] + s['inference_tokens_per_s']:.0f} tok/s, SLO "
                     f"{(slo * 100 if slo == slo else math.nan):.1f}%", fontsize=8)
        ax2 = ax.twinx()
        ax2.plot(t, tl["rolling_slo"], color="purple", linewidth=1.0)
        ax2.axhline(0.95, color="purple", linestyle=":", linewidth=0.8)
        ax2.set_ylim(0, 1.05)
        if i == n - 1:
            ax2.set_ylabel("rolling SLO attainment", color="purple")
        else:
            ax2.set_yticklabels([])
        if i == 0:
            ax.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    shrink_png(out)
    return out


def shrink_png(path: str | Path) -> None:
    """Re-encode as a 256-colour palette PNG: hatching and translucent scatter make a full-colour PNG of a long
    trace several hundred KB, too much for result files kept in git; the palette keeps the figure legible."""
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(path) as im:
        small = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)
