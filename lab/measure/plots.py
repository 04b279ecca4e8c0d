"""Plots: launch timelines (host submits above, device kernels below) and launch-bill bars.
Every figure carries its source in the title: "simulated" or "measured on <GPU, versions>"."""
from __future__ import annotations

import matplotlib.pyplot as plt  # headless machines fall back to Agg by themselves

_FAMILY_COLORS = {"embed": "#8c564b", "rmsnorm": "#7f7f7f", "matvec": "#1f77b4",
                  "matvec_residual": "#1f77b4", "rope_kv_append": "#9467bd",
                  "attn_partial": "#d62728", "attn_merge": "#ff9896", "attn_combine": "#ff7f0e",
                  "swiglu_up": "#2ca02c", "argmax_next": "#17becf", "advance": "#bcbd22"}


def timeline(events, ax=None, title: str = "", source: str = "simulated", t0: float | None = None):
    """Draw sim TimelineEvents: one host lane (submits) and one device lane per stream (kernels).
    Times in microseconds from the first event (or t0)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 2.6))
    if not events:
        ax.set_title(f"{title} (no events)")
        return ax
    start = min(min(e.host_start, e.dev_start) for e in events) if t0 is None else t0
    streams = sorted({e.stream for e in events})
    lanes = {"host": 0, **{f"device:{s}": i + 1 for i, s in enumerate(streams)}}
    seen_submit = set()
    for e in events:
        color = _FAMILY_COLORS.get(e.kernel, "#444444")
        key = (e.host_start, e.host_end)
        if e.kind == "eager" or key not in seen_submit:   # one bar per graph submit
            seen_submit.add(key)
            ax.barh(lanes["host"], e.host_end - e.host_start, left=e.host_start - start,
                    color=color if e.kind == "eager" else "#333333", height=0.6,
                    edgecolor="white", linewidth=0.3)
        ax.barh(lanes[f"device:{e.stream}"], e.dev_end - e.dev_start, left=e.dev_start - start,
                color=color, height=0.6, edgecolor="white", linewidth=0.3)
    ax.set_yticks(list(lanes.values()), list(lanes.keys()))
    ax.invert_yaxis()
    ax.set_xlabel("time (us)")
    ax.set_title(f"{title} [{source}]")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in dict.fromkeys(_FAMILY_COLORS.values())]
    names = {}
    for k, c in _FAMILY_COLORS.items():
        names.setdefault(c, k)
    ax.legend(handles, list(names.values()), fontsize=7, ncol=6, loc="upper center",
              bbox_to_anchor=(0.5, -0.35), frameon=False)
    return ax


def bill_bars(bills, ax=None):
    """Bar chart of ms/token per mode, annotated with launches/token and us/launch."""
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3))
    names = [b.mode for b in bills]
    ms = [b.ms_per_token for b in bills]
    bars = ax.bar(names, ms, color=["#d62728", "#1f77b4", "#2ca02c", "#9467bd"][:len(bills)])
    for bar, b in zip(bars, bills):
        ax.annotate(f"{b.launches_per_token} launches\n{b.us_per_launch:.2f} us/launch",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                    va="bottom", fontsize=8)
    ax.set_ylabel("ms / token")
    ax.set_ylim(0, max(ms) * 1.35)
    ax.set_title(f"launch bill [{bills[0].source.split(',')[0]}]", fontsize=9)
    return ax
