"""Record the precision figures of notebook 09 (KV cache float32 vs float16 vs the float64 oracle,
and the kernels' summation order), as JSON with source, versions and date.

  python scripts/record_gpu_precision.py --out DIR [--backend cuda|sim|auto] [--tokens 200]
                                         [--text-offset 20000] [--text-chars 1000]

Writes DIR/precision.json:
  decode        the oracle decodes --tokens tokens greedily after 'ROMEO.\\n'; a float32 and a
                float16 KV cache are fed its ids: per-step KL both ways, top-1, max |Δlogit|,
                margins, for oracle-float32, oracle-float16 and float32-float16
  text          the same three sides fed a corpus passage (data/corpus.txt from --text-offset,
                --text-chars characters): where float16 flips a greedy pick, and at what margin
  kernel_order  matvec, rmsnorm and argmax_next run by themselves (on the GPU: fused fma), their
                bits against the NumPy order mirrors and the twins (lab/measure/precision.py)
`--backend sim` is a quick local smoke run (kernels on numba's CUDA simulator); its output is
labelled simulated and is not a GPU recording.
"""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.config import LabConfig  # noqa: E402
from lab.measure.compare import DEFAULT_PROMPT, kv_dtype_study, slim  # noqa: E402
from lab.measure.precision import kernel_order_check  # noqa: E402
from lab.model import DATA_DIR  # noqa: E402
from scripts import recorder  # noqa: E402


def _dumps(res: dict) -> str:
    """Indented JSON, each list of plain numbers (a per-step column) kept on one line."""
    def one_line(m):
        return "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]"
    return re.sub(r"\[([^\[\]{}\"]*)\]", one_line, json.dumps(res, indent=1))


def _line(name: str, pair: dict) -> str:
    s = pair["summary"]
    d = s["first_divergence"]
    flip = "none" if d is None else f"step {d['step']} (margin {d['margin_a']:.3g})"
    return (f"  {name:<16} mean KL {s['mean_kld_ab']:.3g} / {s['mean_kld_ba']:.3g}, max |Δlogit| "
            f"{s['max_dlogit']:.3g}, top-1 {s['top1_agree_steps']}/{s['steps']}, first flip {flip}")


def _arguments(argv=None):
    ap = recorder.arguments(__doc__, backends=recorder.BACKENDS, weights=True,
                            out_help="folder for precision.json")
    ap.add_argument("--tokens", type=int, default=200, help="tokens the oracle decodes")
    ap.add_argument("--text-offset", type=int, default=20000, help="passage start in corpus.txt")
    ap.add_argument("--text-chars", type=int, default=1000, help="passage length")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = _arguments(argv)
    out = recorder.out_dir(args.out)
    model, cfg = recorder.load(args), LabConfig(backend=args.backend)
    t0 = time.perf_counter()
    decode = kv_dtype_study(model, DEFAULT_PROMPT, args.tokens, cfg, args.weights, progress=None)
    corpus = (DATA_DIR / "corpus.txt").read_text()
    passage = corpus[args.text_offset:args.text_offset + args.text_chars]
    text = kv_dtype_study(model, base=cfg, weights=args.weights, text=passage, progress=None)
    text.update(offset=args.text_offset, chars=len(passage))
    on_gpu = not decode["source"].startswith("simulated")
    order = kernel_order_check("gpu" if on_gpu else "cudasim")
    res = {"what": "notebook 09: KV cache float32 vs float16 vs the float64 oracle; kernel order",
           "source": decode["source"], "date": recorder.today(),
           "weights": decode["pairs"]["oracle-float32"]["sides"]["oracle"]["sha256"],
           "decode": slim(decode), "text": slim(text, keep=("max_dlogit", "margin_a")),
           "kernel_order": order}
    path = recorder.write_text(out / "precision.json", _dumps(res))
    print(f"source: {res['source']}")
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
    print(f"wrote {path} in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(recorder.run(main))
