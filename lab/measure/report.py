"""Reading bench results: tables, plots and files. `lab/measure/bench.py` measures and returns plain
dicts; this module turns a result into what a person reads (a table that fits a notebook cell, a
plot whose title names the source) and writes it (JSON and plots, each file whole or not at
all). Every table ends with the result's source: the GPU and versions, or "simulated", and
shows each arm's replay share (bench.py's replay gate), with a NOT MEANINGFUL line when the
result failed a gate.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from lab.files import atomic_write, atomic_write_text


def source_label(source: str) -> str:
    return "simulated" if source.startswith("simulated") else source.split(",")[0]


def _hang(line: str, width: int) -> str:
    """The indent of a wrapped line's continuation: a table row (columns set apart by two or
    more spaces) continues under its last column, so the row keeps its columns; prose by 4."""
    import re
    starts = [m.end() for m in re.finditer(r"\S {2,}(?=\S)", line[:width])]
    return " " * (starts[-1] if starts and starts[-1] <= width // 2 else 4)


def wrapped(text: str, width: int = 100) -> str:
    """`text` with every line longer than `width` wrapped (indented continuation lines; a table
    row's continue under its last column), between words only: "byte-identical" stays whole."""
    import textwrap
    return "\n".join(textwrap.fill(line, width, subsequent_indent=_hang(line, width),
                                   break_on_hyphens=False)
                     if len(line) > width else line for line in str(text).splitlines() or [""])


def show(text, width: int = 100) -> None:
    """Print `text` with every line longer than `width` wrapped (the notebooks' printer)."""
    print(wrapped(text, width))


def narrow(result: dict) -> dict:
    """A copy of an A/B or leave-one-out result whose arms keep only the toggles that differ
    between them: a table that fits a page or a notebook cell."""
    aa = result.get("aa") or {}
    every = result["arms"] + aa.get("arms", [])
    names = dict.fromkeys(k for a in every for k in a["toggles"])
    keep = [k for k in names if len({a["toggles"].get(k) for a in every}) > 1]

    def cut(arm):
        return {**arm, "toggles": {k: arm["toggles"].get(k, "0") for k in keep}}

    out = {**result, "arms": [cut(a) for a in result["arms"]]}
    if aa:
        out["aa"] = {**aa, "arms": [cut(a) for a in aa["arms"]]}
    return out


def _toggle_text(toggles: dict) -> str:
    return " ".join(f"{k[4:]}={v}" for k, v in toggles.items() if k != "LAB_BACKEND")


def _tw(arms) -> int:
    """Width of the toggles column: the widest toggle text of these arms."""
    return max([7] + [len(_toggle_text(a["toggles"])) for a in arms])


def _f(x, fmt=".4f") -> str:
    """`x` formatted; "-" for a figure that was not measured (None), "nan" for one that was."""
    if x is None:
        return "-"
    return "nan" if isinstance(x, float) and math.isnan(x) else format(x, fmt)


def _replays(arm: dict) -> str:
    """An arm's replay share (ledger: replays / graph-mode steps of its timed runs): "-" when no
    step ran in graph mode (eager), "?" when the result predates the ledger's report."""
    if "replay_fraction" not in arm:
        return "?"
    f = arm["replay_fraction"]
    return "-" if f is None else f"{100 * f:.1f}%"


def _gate_lines(result: dict, arms) -> list[str]:
    """The footer lines of the replay gate: what "?" means, and the verdict it refuses."""
    lines = []
    if any(_replays(a) == "?" for a in arms):
        lines.append("replays ?: not in this result (recorded before arms reported their ledger)")
    if result.get("meaningful") is False:
        lines.append(f"NOT MEANINGFUL: {result['reason']}")
    return lines


def _ab_rows(result: dict) -> list[tuple[str, dict]]:
    """(label, arm) for the A/A pair (when present) and the A/B pair."""
    aa = [(f"{a['name']} (A/A)", a) for a in result["aa"]["arms"]] if result.get("aa") else []
    return aa + [(a["name"], a) for a in result["arms"]]


def format_ab(result: dict) -> str:
    """The A/A gate, the arms' table (only the toggles that differ between arms: `narrow`) and
    the verdict."""
    result = narrow(result)
    lines = []
    aa = result.get("aa")
    if aa:
        lines.append(f"A/A gate ({aa['arms'][0]['name']} vs {aa['arms'][1]['name']}): "
                     f"{'PASS' if aa['ok'] else 'FAIL'}  paired t = {aa['t']:.2f} "
                     f"(threshold {aa['threshold']:.2f}"
                     + (f", {aa['alpha']:.0%} false alarms" if aa.get("alpha") else "") + "), outputs "
                     f"{'byte-identical' if aa['outputs_identical'] else 'DIFFER'}")
    tw = _tw([a for _, a in _ab_rows(result)])
    nw = max([13] + [len(label) for label, _ in _ab_rows(result)])   # long arm names: A/A rows
    pct = any(a.get("per_token") for _, a in _ab_rows(result))   # a per-token pass ran
    lines.append(f"{'arm':<{nw}} {'toggles':<{tw}} {'ms/token':>9} {'± sem us':>9} "
                 + (f"{'p50 ms':>8} {'p99 ms':>8} " if pct else "")
                 + f"{'launches/tok':>12} {'nodes/graph':>11} {'replays':>7}")
    for label, arm in _ab_rows(result):
        pt = arm.get("per_token") or {}
        lines.append(f"{label:<{nw}} {_toggle_text(arm['toggles']):<{tw}} "
                     f"{arm['mean_ms']:>9.4f} {_f(arm['sem_ms'] * 1000, '.2f'):>9} "
                     + (f"{_f(pt.get('p50')):>8} {_f(pt.get('p99')):>8} " if pct else "")
                     + f"{arm['launches_per_token']:>12} {arm['nodes_per_graph']:>11} "
                     f"{_replays(arm):>7}")
    p = result.get("p")
    a, b = (arm["name"] for arm in result["arms"])
    lines.append(f"{b} - {a} = {result['diff_b_minus_a_ms']:+.4f} ms/token ± {result['diff_sem_ms']:.4f} "
                 f"(paired t = {result['t']:.1f}{'' if p is None else f', p = {p:.2g}'}); "
                 f"{a}/{b} ratio {result['speedup_a_over_b']:.2f}x; "
                 f"{result['reps']} reps x {result['tokens']} tokens")
    if "sem_ratio_a_over_b" in result:
        lines.append(f"sem ratio {a}/{b} {result['sem_ratio_a_over_b']:.1f}x" + (
            f"; per-token p50/p99 over {result['per_token_samples']} tokens per arm (separate "
            f"pass, clock per step)" if result.get("per_token_samples") else ""))
    lines += _gate_lines(result, [a for _, a in _ab_rows(result)])
    lines.append(f"source: {result['source']}")
    return "\n".join(lines)


def _ms(x: dict) -> str:
    """ms/token and its standard error in us, as every table prints them."""
    return f"{x['mean_ms']:>9.4f} {_f(x['sem_ms'] * 1000, '.2f'):>9}"


def _close(lines: list[str], result: dict, gated, last: str) -> str:
    """A table's end: the replay gate's lines for the `gated` arms or rows, then `last`."""
    return "\n".join(lines + _gate_lines(result, gated) + [last])


def format_ladder(result: dict) -> str:
    def what(a):
        if not a.get("stand_in"):
            return a["what"]
        return (f"{a['what']} [SIMULATED FROM A STAND-IN: no recorded cost for "
                f"{', '.join(a['stand_in'])} in the cost file]")
    persistent = [a for a in result["arms"] if a.get("toggles", {}).get("LAB_PERSISTENT") == "1"]
    lines = [f"{'rung':<11} {'ms/token':>9} {'± sem us':>9} {'launches/tok':>12} {'us/launch':>9}"
             f" {'replays':>7}  what it removes"]
    lines += [f"{a['name']:<11} {_ms(a)} {a['launches_per_token']:>12} {a['us_per_launch']:>9.2f} "
              f"{_replays(a):>7}  {what(a)}" for a in result["arms"]]
    if (result.get("meaningful") is not False and "graph_over_prebound" in result
            and "graph_over_dispatcher" in result):
        outputs = f"outputs {'byte-identical' if result['outputs_identical'] else 'DIFFER'}"
        if persistent and "token_ids_identical" in result:
            outputs = (f"{outputs} within each arithmetic (the persistent rung's is the fused "
                       f"step's), token ids "
                       f"{'identical' if result['token_ids_identical'] else 'DIFFER'} across all")
        lines.append(f"graph replay: {result['graph_over_prebound']:.1f}x less time per token than "
                     f"pre-bound eager, {result['graph_over_dispatcher']:.1f}x less than the "
                     f"dispatcher; {outputs}")
    lines += [f"rung {name} not run: {why}" for name, why in result.get("skipped", {}).items()]
    where = ("interleaved, the launch rungs on one engine and the persistent rung on its own"
             if persistent else "interleaved on one engine")
    return _close(lines, result, result["arms"], f"{result['reps']} reps x {result['tokens']} "
                  f"tokens, {where}; source: {result['source']}")


def format_sweep(result: dict) -> str:
    head = [f"{'context':>7} {'splits':>6} {'arm':<22} {'ms/token':>9} {'± sem us':>9} "
            f"{'tok/s':>9} {'replays':>7}"]
    rows = [f"{r['context']:>7} {r['splits']:>6} {r['arm']:<22} {_ms(r)} {r['tok_per_s']:>9.0f} "
            f"{_replays(r):>7}" for r in result["rows"]]
    return _close(head + rows, result, result["rows"], f"{result['reps']} reps x "
                  f"{result['tokens']} tokens per context, kv_init {result['kv_init']}; source: "
                  f"{result['source']}")


def format_peer(res: dict) -> str:
    """The peer recording (decode-lab record peer, peer.json) as a table: ms/token per arm
    and context, each lab arm's ratio to torch.compile, the tokens check."""
    compile_arm = res["method"].get("compile_arm", "torch.compile")
    m = res["method"]
    lines = [f"peer: decode-lab vs PyTorch, same model and weights ({res['weights']['file']}), "
             f"float32, greedy on the device",
             f"{m['reps']} reps x {m['tokens_per_rep']} tokens per arm and context, arm order "
             f"rotated per rep; {m['process_separation']}",
             f"{'context':>7} {'arm':<21} {'process':<7} {'ms/token':>9} {'± sem us':>9} "
             f"{'tok/s':>7} {'replays':>7} {'tokens':>8} {'/ torch.compile':>15}"]
    for c in m["contexts"]:
        rows = res["results"][str(c)]
        for arm in res["arm_order"]:
            row = rows[arm]
            proc = "lab" if arm.startswith("lab") else "torch"
            if "mean_ms" not in row:
                lines.append(f"{c:>7} {arm:<21} {proc:<7} FAILED: {row['error']}")
                continue
            f = row.get("replay_fraction")
            rep = "-" if f is None else f"{100 * f:.1f}%"
            tok = "same" if row["tokens_match_reference"] else "DIFFER"
            ratio = row.get("ratio_to_torch_compile")
            rtxt = "-" if ratio is None else f"{ratio:.3f}"
            lines.append(f"{c:>7} {arm:<21} {proc:<7} {row['mean_ms']:>9.4f} "
                         f"{1000 * row['sem_ms']:>9.2f} {row['tok_per_s']:>7.0f} {rep:>7} "
                         f"{tok:>8} {rtxt:>15}")
    for peer in dict.fromkeys([compile_arm, m.get("strongest_arm", compile_arm)]):
        for c in m["contexts"]:
            parts = [f"{arm} {r[peer]['ratio']:.3f} ± {r[peer]['sem']:.3f}"
                     for arm, r in res["ratios"].get(str(c), {}).items() if peer in r]
            if parts:
                lines.append(f"lab / {peer} ms/token at context {c}: {', '.join(parts)}")
    for c in m["contexts"]:
        for arm, row in res["results"][str(c)].items():
            if "host_share" in row:
                lines.append(f"{arm} at context {c}: the host issues a step in "
                             f"{row['mean_host_ms']:.4f} ms of its {row['mean_ms']:.4f} "
                             f"({100 * row['host_share']:.0f}%)"
                             + (": host-bound, the device waits on the host's Python" if row["host_bound"]
                                else ""))
    for arm, sec in res.get("torch_worker", {}).get("compile_s", {}).items():
        lines.append(f"{arm}: {sec:.1f} s compiling (and first runs)")
    tc = res["tokens_check"]
    if tc["ok"]:
        lines.append(f"tokens: every arm generated the same {m['tokens_per_rep']} ids at every "
                     f"context and rep")
    else:
        for mm in tc["mismatches"]:
            lines.append(f"TOKENS MISMATCH: {mm['arm']} at context {mm['context']} differs from "
                         f"{mm['reference_arm']} from generated token {mm['token_index']} "
                         f"(reps {mm['reps_differing']})")
    orc = tc.get("oracle") or {}
    if orc:
        parts = [f"{c}: " + ("same" if o["reference_matches_oracle"]
                             else f"differs from token {o['first_diff']}") for c, o in orc.items()]
        lines.append(f"float64 oracle vs the reference ids (information): {', '.join(parts)}")
    for arm, why in res["failed_arms"].items():
        lines.append(f"ARM FAILED: {arm}: {why}")
    for w in res.get("warnings", []):
        lines.append(f"warning: {w}")
    lines.append(f"source: {res['source']}")
    return "\n".join(lines)


def format_loo(result: dict) -> str:
    """The leave-one-out arms (only the toggles that differ: `narrow`) and the table."""
    result = narrow(result)
    tw = _tw(result["arms"])
    lines = [f"{'arm':<20} {'toggles':<{tw}} {'ms/token':>9} {'± sem us':>9} {'replays':>7}"]
    for a in result["arms"]:
        lines.append(f"{a['name']:<20} {_toggle_text(a['toggles']):<{tw}} {a['mean_ms']:>9.4f} "
                     f"{_f(a['sem_ms'] * 1000, '.2f'):>9} {_replays(a):>7}")
    lines.append("")
    lines.append(f"{'factor':<20} {'worth = off - all-on (ms/token)':>32} {'± sem us':>9} {'t':>8}")
    for r in result["rows"]:
        lines.append(f"{r['factor']:<20} {r['worth_ms']:>+32.4f} {_f(r['sem_ms'] * 1000, '.2f'):>9} "
                     f"{_f(r['t'], '.1f'):>8}")
    b = result["baseline"]
    lines.append(f"baseline (all-off, un-interleaved): {b['mean_ms']:.4f} ± {_f(b['sem_ms'])} "
                 f"ms/token; gap {b['gap_ms']:+.4f} ± {b['gap_sem_ms']:.4f} -> "
                 f"{'ok' if b['ok'] else 'FLAGGED: ' + b['reason']}")
    lines += _gate_lines(result, result["arms"] + [b])
    lines.append(f"{result['reps']} reps x {result['tokens']} tokens; source: {result['source']}")
    return "\n".join(lines)


def plot(result: dict, ax=None):
    """One figure per result kind (A/B, sweep, leave-one-out); the title names the source."""
    import matplotlib.pyplot as plt
    label = source_label(result["source"])
    if "rows" in result and "contexts" in result:                       # sweep
        if ax is None:
            _, ax = plt.subplots(figsize=(6, 3.5))
        for name in result["arms"]:
            rs = [r for r in result["rows"] if r["arm"] == name]
            ax.errorbar([r["context"] for r in rs], [r["mean_ms"] for r in rs],
                        yerr=[r["sem_ms"] for r in rs], marker="o", capsize=3, label=name)
        ax.set_xlabel("context length")
        ax.set_ylabel("ms / token")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
        ax.set_title(f"decode speed vs context [{label}]", fontsize=9)
    elif "factors" in result:                                           # leave-one-out
        if ax is None:
            _, ax = plt.subplots(figsize=(6, 3))
        rows = result["rows"]
        ax.barh([r["factor"] for r in rows], [r["worth_ms"] for r in rows],
                xerr=[r["sem_ms"] for r in rows], capsize=3, color="#1f77b4")
        ax.axvline(0, color="black", linewidth=0.5)
        ax.set_xlabel("ms/token added when switched off (± sem)")
        ax.set_title(f"leave-one-out [{label}]", fontsize=9)
    else:                                                               # A/B
        rows = _ab_rows(result)
        arms = [a for _, a in rows]
        if ax is None:
            _, axes = plt.subplots(1, 2, figsize=(9, 3.2))
        else:
            axes = ax
        names = [label for label, _ in rows]
        axes[0].bar(names, [a["mean_ms"] for a in arms], yerr=[a["sem_ms"] for a in arms],
                    capsize=4, color="#1f77b4")
        axes[0].set_ylabel("ms / token (± sem)")
        axes[0].set_title(f"A/A and A/B [{label}]", fontsize=9)
        axes[1].bar(names, [a["sem_ms"] * 1000 for a in arms], color="#d62728")
        axes[1].set_yscale("log")
        axes[1].set_ylabel("standard error (us / token)")
        axes[1].set_title(f"noise per arm, {result['reps']} reps [{label}]", fontsize=9)
        ax = axes
    return ax


def jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def save(result: dict, json_path=None, plot_path=None) -> list[str]:
    """Write the result as JSON and/or its plot, each file whole or not at all; the paths."""
    written = []
    if json_path:
        text = json.dumps(result, indent=2, default=jsonable)
        written.append(str(atomic_write_text(json_path, text)))
    if plot_path:
        import matplotlib.pyplot as plt
        ax = plot(result)
        fig = (ax[0] if isinstance(ax, (list, tuple, np.ndarray)) else ax).figure
        fig.tight_layout()
        fmt = Path(plot_path).suffix.lstrip(".").lower()
        written.append(str(atomic_write(plot_path, lambda tmp: fig.savefig(tmp, dpi=120, format=fmt))))
        plt.close(fig)
    return written
