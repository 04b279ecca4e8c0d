"""precision.json: KV cache float32 vs float16 vs the float64 oracle, and summation order (notebook 09).

  decode        the oracle decodes TOKENS tokens greedily after the prompt; float32 and float16
                KV caches are fed its ids: per-step KL both ways, top-1, max |Δlogit|, margins
  text          the three sides fed a corpus passage: where float16 flips a greedy pick
  kernel_order  matvec, rmsnorm and argmax_next alone (on the GPU: fused fma), their bits
                against the NumPy order mirrors and the twins (lab/measure/precision.py)
"""
from __future__ import annotations

import json
import re

from lab.config import LabConfig
from lab.measure.experiment import experiment, today

TOKENS, TEXT_OFFSET, TEXT_CHARS = 200, 20000, 1000


def _dumps(res: dict) -> str:
    """Indented JSON, each list of plain numbers (a per-step column) kept on one line."""
    def one_line(m):
        return "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]"
    return re.sub(r"\[([^\[\]{}\"]*)\]", one_line, json.dumps(res, indent=1)) + "\n"


def _line(name: str, pair: dict) -> str:
    s = pair["summary"]
    d = s["first_divergence"]
    flip = "none" if d is None else f"step {d['step']} (margin {d['margin_a']:.3g})"
    return (f"  {name:<16} mean KL {s['mean_kld_ab']:.3g} / {s['mean_kld_ba']:.3g}, max |Δlogit| "
            f"{s['max_dlogit']:.3g}, top-1 {s['top1_agree_steps']}/{s['steps']}, first flip {flip}")


@experiment("precision", ("precision.json",), priority=70)
def precision(ctx) -> None:
    """float32 and float16 KV caches against the float64 oracle, on a decode and on a corpus
    passage, and the kernels' summation order against NumPy mirrors (notebook 09)."""
    from lab.measure.compare import DEFAULT_PROMPT, kv_dtype_study, slim
    from lab.measure.precision import kernel_order_check
    from lab.model import DATA_DIR
    tokens, chars = (8, 40) if ctx.quick else (TOKENS, TEXT_CHARS)
    cfg, weights = LabConfig(backend=ctx.backend), str(ctx.weights)
    decode = kv_dtype_study(ctx.model, DEFAULT_PROMPT, tokens, cfg, weights, progress=None)
    passage = (DATA_DIR / "corpus.txt").read_text()[TEXT_OFFSET:TEXT_OFFSET + chars]
    text = kv_dtype_study(ctx.model, base=cfg, weights=weights, text=passage, progress=None)
    text.update(offset=TEXT_OFFSET, chars=len(passage))
    order = kernel_order_check("cudasim" if decode["source"].startswith("simulated") else "gpu")
    res = {"what": "notebook 09: KV cache float32 vs float16 vs the float64 oracle; kernel order",
           "source": decode["source"], "date": today(),
           "weights": decode["pairs"]["oracle-float32"]["sides"]["oracle"]["sha256"],
           "decode": slim(decode), "text": slim(text, keep=("max_dlogit", "margin_a")),
           "kernel_order": order, "provenance": ctx.stamp}
    ctx.write_text("precision.json", _dumps(res))
    for name, study in (("decode", decode), ("text", text)):
        print(f"{name} ({study['steps']} steps, {study['input']}):")
        for pair, r in study["pairs"].items():
            print(_line(pair, r))
    for kern in ("matvec", "rmsnorm"):
        k = order[kern]
        print(f"{kern} on {order['where']}: {k['same_as_mirror']}/{k['elements']} bit-identical "
              f"to the order mirror, {k['same_as_twin']}/{k['elements']} to the twin")
    picks = sum(c["kernel"] == c["rule"] for c in order["argmax"])
    print(f"argmax_next: {picks}/{len(order['argmax'])} crafted cases pick as the rule says")
