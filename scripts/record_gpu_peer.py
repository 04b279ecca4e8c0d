"""Record decode-lab's graph arms against a PyTorch peer of the SAME model from the SAME weight
file, as JSON with source and date.

  python scripts/record_gpu_peer.py --out DIR [--reps 7] [--tokens 64] [--contexts 64,900]

Needs PyTorch (the optional extra: pip install -e ".[peer]"); without it the script says so in
one line and exits 2. Writes DIR/peer.json and prints a table.

Arms (float32 everywhere, greedy argmax on the device inside the step):
  decode-lab (this process)   lab graph (LAB_GRAPH=1), lab graph+pdl (LAB_PDL=1) and, when
                              lab/config.py has a `fusion` toggle, lab graph+pdl+fusion; the
                              arms share ONE engine, switched per run (as lab/bench.py does)
  PyTorch (a worker process)  torch eager: the step as eager torch ops on a static,
                              preallocated KV cache (index_copy_, no torch.cat);
                              torch cudagraph: that step captured with torch.cuda.CUDAGraph,
                              one graph per attention-length bucket;
                              torch.compile: torch.compile(step, mode="reduce-overhead"),
                              one specialisation per bucket (dynamic=False)
The torch step keeps its state on the device as the lab's does: token ids [max_seq], the
position [1] (advanced inside the step) and the prompt length [1]; so one graph replays every
step of a request, prompt and generation alike. Its attention reads the first L cache rows and
masks those past the position; L is the bucket: max(128, the next power of two >= position + 1)
(`--buckets pow2`, the default), or max_seq for every position (`--buckets full`: one graph).
TF32 is OFF for matmuls (torch.backends.cuda.matmul.allow_tf32 = False, float32 matmul
precision "highest"), so the torch arms' tokens stay comparable with the lab's.

Context c: the prompt is c + 1 characters of data/corpus.txt; every arm feeds it one position
per step through a decode step (untimed: the lab arms each through their own; the torch arms
share one such prefill per context per rep, run by the cudagraph arm's graphs on a GPU), then
times `--tokens` steps at positions c .. c + tokens - 1 (ms/token over the window, synchronised
at its two ends only, garbage collector off). Every arm runs one untimed warm-up per context
first (captures, compiles). Reps are interleaved: rep i runs the lab arms here and the torch arms
in the worker, the lab first on even reps and the worker first on odd ones, each side's arm
order rotated per rep.

The torch arms run in their OWN process (this script re-invoked with --torch-worker, JSON lines
over a pipe): once torch has run kernels in a process, every later CUDA graph node in it
(numba's too) replays about 0.18 us slower, so torch never runs in the lab's process.

Every arm's generated ids are checked against the first lab arm's, at every context and rep,
and against the float64 oracle's (lab/reference.py, for information). A mismatch is printed
loudly and recorded; the file is still written and the exit status is 1. A torch arm that could
not be built (a failed capture or compile) is recorded with its error, likewise exit 1.

Most of the wall time is torch.compile's compiles (one per bucket the windows meet: two with
the defaults), which overlap the lab's set-up; the reps themselves take seconds.

A dry run without a GPU: --backend sim --torch-device cpu --torch-arms eager (the simulator's
lab arms against eager torch on the CPU; --torch-python PYTHON runs the worker in another
interpreter, e.g. one with torch when this one has none).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import functools
import gc
import importlib.util
import json
import math
import os
import platform
import queue
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lab.errors import LabError  # noqa: E402  (numpy only: the worker imports no numba or CuPy)
from lab import report  # noqa: E402
from lab.model import DEFAULT_WEIGHTS, load_model, sha256_of  # noqa: E402

RECORDED_BY = "scripts/record_gpu_peer.py"
INSTALL_HINT = 'pip install -e ".[peer]"'
CORPUS = REPO / "data" / "corpus.txt"
MIN_BUCKET = 128
LAB_ARMS = ("lab graph", "lab graph+pdl", "lab graph+pdl+fusion")
TORCH_ARMS = {"eager": "torch eager", "graph": "torch cudagraph", "compile": "torch.compile"}
COMPILE_ARM = TORCH_ARMS["compile"]
TORCH_WHAT = {
    "torch eager": "eager torch ops, static preallocated KV cache (index_copy_ at the device "
                   "position), argmax on the device",
    "torch cudagraph": "the eager step captured with torch.cuda.CUDAGraph (warm-up on a side "
                       "stream, capture on it), one graph per attention-length bucket, "
                       "replayed with graph.replay()",
    "torch.compile": 'torch.compile(step, mode="reduce-overhead", fullgraph=True, '
                     "dynamic=False): one specialisation (and CUDA graph) per attention-length "
                     "bucket; torch.compiler.cudagraph_mark_step_begin() before each step",
}
LAB_WHAT = {
    "lab graph": "LabConfig(graph=True): the lab's step replayed as one CUDA graph per plan",
    "lab graph+pdl": "LabConfig(graph=True, pdl=True): programmatic dependent launch",
    "lab graph+pdl+fusion": "LabConfig(graph=True, pdl=True) + LAB_FUSION=1",
}


# ---- shared helpers (no torch) -----------------------------------------------------------------
def attention_length(position: int, max_seq: int, scheme: str) -> int:
    """Cache rows the torch step's attention reads at `position` (rows past it are masked):
    "pow2": max(MIN_BUCKET, the next power of two >= position + 1), capped at max_seq;
    "full": max_seq for every position."""
    if scheme == "full":
        return max_seq
    if scheme != "pow2":
        raise ValueError(f"unknown bucket scheme {scheme!r}")
    length = MIN_BUCKET
    while length < position + 1:
        length *= 2
    return min(length, max_seq)


def window_lengths(contexts, tokens: int, max_seq: int, scheme: str) -> dict[int, list[int]]:
    """The attention lengths each context's timed window meets."""
    return {c: sorted({attention_length(p, max_seq, scheme) for p in range(c, c + tokens)})
            for c in contexts}


def corpus_prompt(model, offset: int, context: int) -> tuple[str, np.ndarray]:
    """The prompt of context `context`: context + 1 characters of the corpus from `offset`."""
    text = CORPUS.read_text()[offset:offset + context + 1]
    if len(text) != context + 1:
        raise LabError(f"data/corpus.txt has no {context + 1} characters from offset {offset}")
    return text, model.tokenizer.encode(text)


def mean_sem(values) -> tuple[float, float]:
    v = np.asarray(values, dtype=np.float64)
    if v.size < 2:
        return float(v.mean()), float("nan")
    return float(v.mean()), float(v.std(ddof=1) / math.sqrt(v.size))


def rotated(items: list, rep: int) -> list:
    k = rep % len(items) if items else 0
    return list(items[k:]) + list(items[:k])


def _first_diff(a, b) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def summarize(contexts, arm_names, data: dict, oracle: dict | None = None,
              failed: dict | None = None, compile_arm: str = COMPILE_ARM) -> dict:
    """Statistics, the tokens check and the ratios from raw per-rep data.

    data[arm][context] = {"ms": [ms/token per rep], "tokens": [generated ids per rep]};
    oracle[context] = the float64 oracle's generated ids; failed[arm] = why an arm has no data.
    The reference ids are the first arm's (with data) first rep at each context."""
    failed = dict(failed or {})
    results, ratios, mismatches, oracle_rows, refs = {}, {}, [], {}, {}
    live = [a for a in arm_names if a not in failed and a in data]
    for c in contexts:
        key = str(c)
        results[key], ratios[key] = {}, {}
        ref_arm = next((a for a in live if data[a].get(key, {}).get("tokens")), None)
        ref = data[ref_arm][key]["tokens"][0] if ref_arm else None
        for arm in arm_names:
            if arm in failed:
                results[key][arm] = {"error": failed[arm]}
                continue
            d = data.get(arm, {}).get(key)
            if not d or not d.get("ms"):
                results[key][arm] = {"error": "no timed runs"}
                continue
            m, s = mean_sem(d["ms"])
            toks = d["tokens"]
            same_reps = all(t == toks[0] for t in toks)
            diffs = [(r, _first_diff(t, ref)) for r, t in enumerate(toks) if t != ref]
            row = {"ms_per_token": list(d["ms"]), "mean_ms": m, "sem_ms": s,
                   "tok_per_s": 1000.0 / m if m else float("nan"),
                   "tokens_match_reference": not diffs, "reps_identical": same_reps}
            if diffs:
                rep, at = diffs[0]
                row["first_mismatch"] = {"rep": rep, "token_index": at,
                                         "ids": toks[rep], "reference_ids": ref}
                mismatches.append({"context": c, "arm": arm, "reference_arm": ref_arm,
                                   "reps_differing": [r for r, _ in diffs],
                                   "rep": rep, "token_index": at})
            if oracle is not None and key in oracle:
                at = _first_diff(toks[0], oracle[key])
                row["matches_oracle"] = at is None
                row["oracle_first_diff"] = at
            for extra in ("replay_fraction", "mode", "ledger", "toggles"):
                if extra in d:
                    row[extra] = d[extra]
            results[key][arm] = row
        base = results[key].get(compile_arm, {})
        for arm in arm_names:
            row = results[key][arm]
            if "mean_ms" not in row:
                continue
            out = {}
            for other in arm_names:
                o = results[key][other]
                if other == arm or "mean_ms" not in o or not arm.startswith("lab") \
                        or other.startswith("lab"):
                    continue
                r = row["mean_ms"] / o["mean_ms"]
                rs = r * math.hypot(row["sem_ms"] / row["mean_ms"], o["sem_ms"] / o["mean_ms"])
                out[other] = {"ratio": r, "sem": rs}
            if out:
                ratios[key][arm] = out
            if "mean_ms" in base:
                row["ratio_to_torch_compile"] = row["mean_ms"] / base["mean_ms"]
        if oracle is not None and key in oracle:
            oracle_rows[key] = {"ids": list(oracle[key]),
                                "reference_matches_oracle": ref is not None
                                and _first_diff(ref, oracle[key]) is None,
                                "first_diff": None if ref is None
                                else _first_diff(ref, oracle[key])}
        refs[key] = {"arm": ref_arm, "ids": ref}
    ok = not mismatches and not failed and bool(live)
    return {"results": results, "ratios": ratios,
            "tokens_check": {"ok": not mismatches and bool(live),
                             "rule": "every rep of every arm generates the reference ids: the "
                                     "first arm's (lab graph's) first rep at that context",
                             "reference": refs, "mismatches": mismatches,
                             "oracle": oracle_rows},
            "failed_arms": failed, "ok": ok}


# ---- the torch model (imported only in the worker, or by the tests) -------------------------
@functools.lru_cache(maxsize=None)
def torch_decoder_class():
    """The torch decoder class (defined here so that importing this script needs no torch)."""
    import torch
    import torch._dynamo
    import torch.nn.functional as F

    from lab.reference import rope_tables

    class TorchDecoder(torch.nn.Module):
        """The lab's model in torch, one decode step at a time, every piece of state on the
        device: weights, RoPE tables, a static KV cache [max_seq, n_head, head_dim] per layer,
        token ids [max_seq], the position [1] and the prompt length [1]. `step(length)` decodes
        the position `pos` holds, writes the argmax to tokens[pos + 1] (from the prompt's end
        on), advances `pos`, and never synchronises with the host, so it can be captured and
        replayed; `length` (a bucket, see attention_length) is the only host-side argument.
        `position` is the host's mirror of `pos`, used only to pick the bucket."""

        def __init__(self, model, device="cpu", buckets: str = "pow2"):
            super().__init__()
            c = self.cfg = model.cfg
            self.device_ = torch.device(device)
            self.scheme = buckets
            attention_length(0, c.max_seq, buckets)          # checks the scheme
            for name, arr in model.weights.items():
                self.register_buffer(name.replace(".", "_"),
                                     torch.from_numpy(np.array(arr, np.float32)).to(self.device_),
                                     persistent=False)
            cos, sin = rope_tables(c.head_dim, c.max_seq, c.rope_theta, np.float32)
            buf = {"rope_cos": torch.from_numpy(cos), "rope_sin": torch.from_numpy(sin),
                   "tokens": torch.zeros(c.max_seq, dtype=torch.int64),
                   "pos": torch.zeros(1, dtype=torch.int64),
                   "n_prompt": torch.ones(1, dtype=torch.int64),
                   "rows": torch.arange(c.max_seq, dtype=torch.int64)}
            for i in range(c.n_layer):
                for kv in ("k", "v"):
                    buf[f"{kv}_cache_{i}"] = torch.zeros(c.max_seq, c.n_head, c.head_dim)
            for name, t in buf.items():
                self.register_buffer(name, t.to(self.device_), persistent=False)
            # static addresses: cudagraphs (torch.compile's) may then mutate them in place
            for t in self.buffers():
                torch._dynamo.mark_static_address(t)
            self.position = 0
            self.n_prompt_host = 1

        def length_at(self, position: int) -> int:
            return attention_length(position, self.cfg.max_seq, self.scheme)

        def lengths_for(self, last_position: int) -> list[int]:
            """Every bucket met by the positions 0 .. last_position."""
            return sorted({self.length_at(p) for p in range(last_position + 1)})

        @staticmethod
        def _rmsnorm(x, w, eps: float):
            return x / torch.sqrt(torch.mean(x * x) + eps) * w

        @staticmethod
        def _rope(x, cos, sin):       # x [n_head, head_dim]; cos/sin [1, head_dim // 2]
            half = x.shape[-1] // 2
            a, b = x[:, :half], x[:, half:]
            return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

        def step(self, length: int) -> None:
            c = self.cfg
            D, H, hd, eps = c.d_model, c.n_head, c.head_dim, c.norm_eps
            pos = self.pos
            tok = self.tokens.index_select(0, pos)
            x = self.tok_emb.index_select(0, tok).reshape(D)
            cos = self.rope_cos.index_select(0, pos)
            sin = self.rope_sin.index_select(0, pos)
            masked = self.rows[:length] > pos                  # rows past the position
            scale = math.sqrt(hd)
            for i in range(c.n_layer):
                kc, vc = getattr(self, f"k_cache_{i}"), getattr(self, f"v_cache_{i}")
                h = self._rmsnorm(x, getattr(self, f"layers_{i}_attn_norm"), eps)
                qkv = torch.mv(getattr(self, f"layers_{i}_wqkv"), h)
                q = self._rope(qkv[:D].reshape(H, hd), cos, sin)
                k = self._rope(qkv[D:2 * D].reshape(H, hd), cos, sin)
                kc.index_copy_(0, pos, k.unsqueeze(0))
                vc.index_copy_(0, pos, qkv[2 * D:].reshape(1, H, hd))
                s = torch.einsum("hd,thd->ht", q, kc[:length]) / scale
                p = torch.softmax(s.masked_fill(masked, float("-inf")), dim=-1)
                att = torch.einsum("ht,thd->hd", p, vc[:length]).reshape(D)
                x = x + torch.mv(getattr(self, f"layers_{i}_wo"), att)
                h = self._rmsnorm(x, getattr(self, f"layers_{i}_mlp_norm"), eps)
                g = torch.mv(getattr(self, f"layers_{i}_w_gate"), h)
                u = torch.mv(getattr(self, f"layers_{i}_w_up"), h)
                x = x + torch.mv(getattr(self, f"layers_{i}_w_down"), F.silu(g) * u)
            logits = torch.mv(self.lm_head, self._rmsnorm(x, self.final_norm, eps))
            nxt = torch.argmax(logits).reshape(1)
            at = pos + 1
            keep = self.tokens.index_select(0, at)             # a prompt id stays a prompt id
            self.tokens.index_copy_(0, at, torch.where(at >= self.n_prompt, nxt, keep))
            self.pos.add_(1)

        # ---- requests (host side, outside any timing) -------------------------------------
        def reset(self, prompt_ids) -> None:
            ids = torch.as_tensor(np.asarray(prompt_ids, np.int64))
            self.tokens.zero_()
            self.tokens[:ids.numel()].copy_(ids)
            self.pos.fill_(0)
            self.n_prompt.fill_(ids.numel())
            self.position, self.n_prompt_host = 0, int(ids.numel())

        def rewind(self) -> None:
            """Back to the prompt's last position, the prompt's KV rows kept, the generated ids
            cleared: the next `run` decodes the same window again."""
            p = self.n_prompt_host
            self.tokens[p:].zero_()
            self.pos.fill_(p - 1)
            self.position = p - 1

        def generated(self, n: int) -> list[int]:
            p = self.n_prompt_host
            return [int(t) for t in self.tokens[p:p + n].cpu().numpy()]

        def all_tokens(self, n: int) -> np.ndarray:
            return self.tokens[:n].cpu().numpy()

        def check_room(self, steps: int) -> None:
            if self.position + steps >= self.cfg.max_seq:
                raise ValueError(f"{steps} steps from position {self.position} would pass "
                                 f"max_seq {self.cfg.max_seq}")

        def run(self, steps: int) -> None:
            """`steps` eager steps from the current position (the eager arm)."""
            self.check_room(steps)
            for _ in range(steps):
                self.step(self.length_at(self.position))
                self.position += 1

    return TorchDecoder


def build_torch_decoder(model, device="cpu", buckets: str = "pow2"):
    return torch_decoder_class()(model, device, buckets)


class GraphRunner:
    """The torch cudagraph arm: one torch.cuda.CUDAGraph of `dec.step(L)` per bucket L, each
    warmed up on a side stream and captured on it; `run` replays the position's bucket."""

    def __init__(self, dec, lengths, warmup_steps: int = 3):
        import torch
        if dec.device_.type != "cuda":
            raise ValueError("torch.cuda.CUDAGraph needs a CUDA device")
        self.dec, self.graphs = dec, {}
        stream = torch.cuda.Stream(device=dec.device_)
        for length in lengths:
            dec.reset([0])                         # warm-up steps write rows 0..: reset later
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(warmup_steps):
                    dec.step(length)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                dec.step(length)
            self.graphs[length] = graph
        torch.cuda.synchronize()
        dec.reset([0])

    def run(self, steps: int) -> None:
        dec = self.dec
        dec.check_room(steps)
        for _ in range(steps):
            self.graphs[dec.length_at(dec.position)].replay()
            dec.position += 1


class CompileRunner:
    """The torch.compile arm: the step compiled (default mode="reduce-overhead", fullgraph,
    dynamic=False: one specialisation per bucket); each step marks a new cudagraph iteration."""

    def __init__(self, dec, **kwargs):
        import torch
        opts = {"mode": "reduce-overhead", "fullgraph": True, "dynamic": False, **kwargs}
        self.dec, self.fn = dec, torch.compile(dec.step, **opts)
        self.mark = torch.compiler.cudagraph_mark_step_begin

    def run(self, steps: int) -> None:
        dec = self.dec
        dec.check_room(steps)
        for _ in range(steps):
            self.mark()
            self.fn(dec.length_at(dec.position))
            dec.position += 1


# ---- the torch worker (its own process) ------------------------------------------------------
def _torch_settings(torch) -> dict:
    """TF32 off for matmuls (and cuDNN), float32 matmul precision "highest"; read back."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    out = {"matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
           "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
           "float32_matmul_precision": torch.get_float32_matmul_precision()}
    try:
        out["matmul_fp32_precision"] = str(torch.backends.cuda.matmul.fp32_precision)
    except Exception:                       # older torch: no fp32_precision
        pass
    return out


_SKIP_REASONS: list[str] = []


def _keep_cudagraph_skips() -> None:
    """Keep inductor's "skipping cudagraphs due to ..." messages (they also reach stderr)."""
    import logging

    class Keep(logging.Handler):
        def emit(self, record):
            if len(_SKIP_REASONS) < 10:
                _SKIP_REASONS.append(" ".join(record.getMessage().split())[:400])
    try:
        from torch._inductor import cudagraph_utils
        cudagraph_utils.cudagraphs_log.addHandler(Keep(logging.WARNING))
    except Exception:                       # another torch layout: the counter still counts
        pass


def _compile_counters() -> dict:
    try:
        from torch._dynamo.utils import counters
    except Exception:
        return {}
    return {"cudagraph_skips": int(counters["inductor"].get("cudagraph_skips", 0)),
            "cudagraph_skip_reasons": list(_SKIP_REASONS),
            "unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
            "graph_breaks": int(sum(counters["graph_break"].values()))}


class TorchPeer:
    """The worker's side: the decoder, the arms, their warm-up, and one rep at a time."""

    def __init__(self, setup: dict, log):
        import torch
        self.torch, self.log = torch, log
        torch.set_grad_enabled(False)
        self.settings = _torch_settings(torch)
        dev = torch.device(setup["device"])
        self.dev = dev
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device (torch.cuda.is_available() is False)")
        model = load_model(setup["weights"])
        self.tokens = int(setup["tokens"])
        self.contexts = [int(c) for c in setup["contexts"]]
        self.prompts = {int(c): np.asarray(ids, np.int64) for c, ids in setup["prompts"].items()}
        self.dec = build_torch_decoder(model, dev, setup["buckets"])
        try:
            limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") \
                else "cache_size_limit"
            setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 16))
        except Exception:
            pass
        self.failed: dict[str, str] = {}
        self.warmup_s: dict[str, dict[str, float]] = {}
        self.runners: dict[str, object] = {}
        last = max(self.contexts) + self.tokens - 1
        for key in setup["arms"]:
            name = TORCH_ARMS[key]
            t0 = time.perf_counter()
            try:
                if key == "eager":
                    self.runners[name] = self.dec
                elif key == "graph":
                    self.runners[name] = GraphRunner(self.dec, self.dec.lengths_for(last))
                elif key == "compile":
                    _keep_cudagraph_skips()
                    self.runners[name] = CompileRunner(self.dec)
            except Exception as exc:
                self.failed[name] = f"{type(exc).__name__}: {exc}"
                log(f"{name} could not be built: {self.failed[name]}")
                continue
            log(f"{name} built in {time.perf_counter() - t0:.1f} s")
        # the prefill runs the cudagraph arm's graphs when there are some, else eager steps
        self.prefill = self.runners.get(TORCH_ARMS["graph"], self.dec)
        for name in list(self.runners):
            self.warmup_s[name] = {}
            for c in self.contexts:
                t0 = time.perf_counter()
                try:
                    self._prefill(c)
                    self.dec.rewind()
                    self.runners[name].run(self.tokens)
                    self.sync()
                except Exception as exc:
                    self.failed[name] = f"warm-up at context {c}: {type(exc).__name__}: {exc}"
                    log(f"{name} failed: {self.failed[name]}")
                    if self.prefill is self.runners.pop(name):
                        self.prefill = self.dec
                    break
                self.warmup_s[name][str(c)] = time.perf_counter() - t0
                log(f"{name} warmed up at context {c} in {self.warmup_s[name][str(c)]:.1f} s")

    def sync(self) -> None:
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize(self.dev)

    def _prefill(self, context: int) -> None:
        ids = self.prompts[context]
        self.dec.reset(ids)
        self.prefill.run(ids.size - 1)
        self.sync()

    def info(self) -> dict:
        torch = self.torch
        dev_name = (torch.cuda.get_device_name(self.dev) if self.dev.type == "cuda"
                    else platform.processor() or "cpu")
        return {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
                "device": str(self.dev), "device_name": dev_name, "settings": self.settings,
                "arms": list(self.runners), "failed": dict(self.failed),
                "warmup_s": self.warmup_s,
                "cudagraph_buckets": sorted(getattr(self.runners.get(TORCH_ARMS["graph"]),
                                                    "graphs", {})),
                "compile_counters": _compile_counters(), "python": platform.python_version()}

    def rep(self, rep: int) -> dict:
        out: dict[str, dict] = {name: {} for name in self.runners}
        order = rotated(list(self.runners), rep)
        for c in self.contexts:
            self._prefill(c)
            for name in order:
                self.dec.rewind()
                self.sync()
                gc.collect()
                gc.disable()
                try:
                    t0 = time.perf_counter()
                    self.runners[name].run(self.tokens)
                    self.sync()
                    ms = 1000.0 * (time.perf_counter() - t0) / self.tokens
                finally:
                    gc.enable()
                out[name][str(c)] = {"ms": ms, "tokens": self.dec.generated(self.tokens)}
        return {"order": order, "data": out}


def worker_main() -> int:
    """--torch-worker: JSON lines on the original stdout (the protocol); anything else printed,
    by us or by torch, goes to stderr (fd 1 is pointed there)."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def send(obj):
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    def log(msg):
        print(f"[torch worker] {msg}", file=sys.stderr, flush=True)

    try:
        import torch
    except Exception as exc:  # ImportError, or a broken install raising at import
        send({"event": "error", "kind": "import", "message": f"{type(exc).__name__}: {exc}"})
        return 3
    send({"event": "imported", "torch": torch.__version__})
    line = sys.stdin.readline()
    if not line:
        return 0
    setup = json.loads(line)
    try:
        t0 = time.perf_counter()
        peer = TorchPeer(setup, log)
        log(f"ready in {time.perf_counter() - t0:.1f} s "
            f"(arms: {', '.join(peer.runners) or 'none'})")
    except Exception as exc:
        send({"event": "error", "kind": "setup", "message": f"{type(exc).__name__}: {exc}",
              "traceback": traceback.format_exc()})
        return 1
    send({"event": "ready", **peer.info()})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("cmd") == "rep":
            try:
                res = peer.rep(int(cmd["rep"]))
            except Exception as exc:
                send({"event": "error", "kind": "rep", "message": f"{type(exc).__name__}: {exc}",
                      "traceback": traceback.format_exc()})
                return 1
            send({"event": "rep", "rep": cmd["rep"], **res})
        elif cmd.get("cmd") == "quit":
            send({"event": "bye", "compile_counters": _compile_counters()})
            return 0
    return 0


class Worker:
    """The parent's handle on the torch worker: JSON lines both ways, a reader thread so that
    every wait has a timeout."""

    def __init__(self, python: str):
        self.proc = subprocess.Popen([python, str(Path(__file__).resolve()), "--torch-worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     bufsize=1, cwd=str(REPO))
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, obj) -> None:
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def recv(self, timeout: float, expect: str) -> dict:
        """The next message; RuntimeError when the worker ended, timed out or reported an error
        (kind and message kept on the exception)."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.stop()
            raise WorkerError("timeout", f"no '{expect}' from the torch worker in {timeout:.0f} s")
        if line is None:
            rc = self.proc.wait()
            raise WorkerError("exit", f"the torch worker ended (exit {rc}) before '{expect}'")
        msg = json.loads(line)
        if msg.get("event") == "error":
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            if msg.get("traceback"):
                print(msg["traceback"], file=sys.stderr, flush=True)
            raise WorkerError(msg.get("kind", "error"), msg["message"])
        return msg

    def stop(self) -> None:
        """Ask the worker to quit (if it still runs), wait for it, kill it if it hangs."""
        if self.proc.poll() is not None:
            return
        try:
            self.send({"cmd": "quit"})
        except OSError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class WorkerError(RuntimeError):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


# ---- the lab's side (this process) -------------------------------------------------------------
def lab_fusion_config(cfg):
    """cfg + LAB_FUSION=1 when lab/config.py has a `fusion` toggle, else None."""
    from lab.config import TOGGLES, LabConfig
    if "fusion" not in {f.name for f in dataclasses.fields(LabConfig)}:
        return None
    if any(row[0] == "LAB_FUSION" for row in TOGGLES):
        return cfg.with_toggles({"LAB_FUSION": "1"})
    return cfg.replace(fusion=True)


def lab_configs(backend: str) -> dict:
    from lab.config import LabConfig
    base = LabConfig(backend=backend, graph=True)
    cfgs = {"lab graph": base, "lab graph+pdl": base.replace(pdl=True)}
    fused = lab_fusion_config(base.replace(pdl=True))
    if fused is not None:
        cfgs["lab graph+pdl+fusion"] = fused
    return cfgs


def lab_run(ids: np.ndarray, tokens: int):
    """A run for bench.Arm.timed: reset, the prompt one position per step (untimed), then the
    timed window; (ms/token, generated ids)."""
    def run(engine):
        engine.reset(ids, tokens)
        engine.decode(ids.size - 1)
        gc.collect()
        gc.disable()
        try:
            seconds = engine.decode(tokens)
        finally:
            gc.enable()
        generated = engine.tokens(ids.size + tokens)[ids.size:]
        return 1000.0 * seconds / tokens, [int(t) for t in generated]
    return run


def lab_versions(backend) -> dict:
    out = {"describe": backend.describe()}
    try:
        import numba
        out["numba"] = numba.__version__
        from importlib.metadata import version
        out["numba_cuda"] = version("numba-cuda")
    except Exception:
        pass
    if backend.name != "sim":
        try:
            import cupy as cp
            out["cupy"] = cp.__version__
            drv, rt = cp.cuda.runtime.driverGetVersion(), cp.cuda.runtime.runtimeGetVersion()
            out["driver"] = f"{drv // 1000}.{drv % 1000 // 10}"
            out["runtime"] = f"{rt // 1000}.{rt % 1000 // 10}"
        except Exception:
            pass
    return out


def say(msg: str) -> None:
    print(f"[peer] {msg}", flush=True)


def fail_line(msg: str, code: int = 2) -> int:
    """One line on stderr (newlines in an exception's text folded), and the exit status."""
    print(f"record_gpu_peer: {' '.join(str(msg).split())}", file=sys.stderr, flush=True)
    return code


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description="decode-lab's graph arms against a PyTorch peer (eager, torch.cuda.CUDAGraph, "
                    "torch.compile reduce-overhead) of the same model and weights; writes "
                    f"OUT/peer.json. Needs the peer extra: {INSTALL_HINT}")
    ap.add_argument("--out", help="folder for peer.json (created)")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "sim", "auto"),
                    help="the lab arms' backend (sim: a dry run on the simulator)")
    ap.add_argument("--weights", default=str(DEFAULT_WEIGHTS))
    ap.add_argument("--reps", type=int, default=7, help="interleaved reps (>= 2; record with >= 5)")
    ap.add_argument("--tokens", type=int, default=64, help="timed tokens per arm, context and rep")
    ap.add_argument("--contexts", default="64,900",
                    help="context lengths: the timed window starts at this position")
    ap.add_argument("--prompt-offset", type=int, default=0,
                    help="where in data/corpus.txt the prompts start")
    ap.add_argument("--torch-arms", default="eager,graph,compile",
                    help=f"comma-separated subset of {','.join(TORCH_ARMS)}")
    ap.add_argument("--torch-device", default="cuda", help="cuda, or cpu for a dry run")
    ap.add_argument("--buckets", default="pow2", choices=("pow2", "full"),
                    help="torch attention length: pow2 = max(128, next power of two >= "
                         "position + 1), one graph per bucket; full = max_seq, one graph")
    ap.add_argument("--torch-python", default=sys.executable,
                    help="the interpreter that runs the torch worker (default: this one)")
    ap.add_argument("--worker-timeout", type=float, default=900.0,
                    help="seconds to wait for the worker's setup (compiles) and for each rep")
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.torch_worker:
        return worker_main()
    if not args.out:
        return fail_line("--out DIR is required")
    try:
        contexts = sorted({int(x) for x in args.contexts.split(",") if x.strip()})
    except ValueError:
        return fail_line(f"--contexts must be comma-separated integers, got {args.contexts!r}")
    arm_keys = [k.strip() for k in args.torch_arms.split(",") if k.strip()]
    if not arm_keys or len(set(arm_keys)) < len(arm_keys) or set(arm_keys) - set(TORCH_ARMS):
        return fail_line(f"--torch-arms: give distinct names from {', '.join(TORCH_ARMS)}")
    if args.reps < 2 or args.tokens < 1 or not contexts:
        return fail_line("need --reps >= 2, --tokens >= 1 and at least one context")
    if args.torch_python == sys.executable and importlib.util.find_spec("torch") is None:
        return fail_line(f"PyTorch is not installed; install the peer extra: {INSTALL_HINT}")
    t_start = time.perf_counter()
    try:
        model = load_model(args.weights)
        max_seq = model.cfg.max_seq
        for c in contexts:
            if c < 0 or c + 1 + args.tokens > max_seq:
                raise LabError(f"context {c} + {args.tokens} tokens needs {c + 1 + args.tokens} "
                               f"positions; max_seq is {max_seq}")
        prompts = {c: corpus_prompt(model, args.prompt_offset, c) for c in contexts}
    except LabError as exc:
        return fail_line(str(exc))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    # the torch worker first: its import says at once whether torch is there, and its
    # compiles then overlap the lab's set-up
    worker = Worker(args.torch_python)
    try:
        return _run(args, model, contexts, prompts, arm_keys, worker, out_dir, t_start)
    finally:
        worker.stop()


def _run(args, model, contexts, prompts, arm_keys, worker, out_dir, t_start) -> int:
    try:
        hello = worker.recv(120.0, "imported")
    except WorkerError as exc:
        if exc.kind == "import":
            return fail_line(f"PyTorch is not importable ({exc}); install the peer extra: "
                             f"{INSTALL_HINT}")
        return fail_line(f"the torch worker did not start: {exc}")
    say(f"torch worker started (torch {hello['torch']}); it builds its arms while the lab "
        f"sets up")
    worker.send({"cmd": "setup", "weights": str(Path(args.weights).resolve()),
                 "device": args.torch_device, "arms": arm_keys, "buckets": args.buckets,
                 "tokens": args.tokens, "contexts": contexts,
                 "prompts": {str(c): [int(i) for i in ids] for c, (_, ids) in prompts.items()}})
    try:
        arms = lab_arms(model, args.backend, contexts, prompts, args.tokens)
    except LabError as exc:
        return fail_line(f"the lab arms could not be built: {exc}")
    from lab.reference import generate as oracle_generate
    oracle = {str(c): [int(t) for t in oracle_generate(model, ids, args.tokens)[ids.size:]]
              for c, (_, ids) in prompts.items()}
    say("float64 oracle tokens computed")

    torch_names = [TORCH_ARMS[k] for k in arm_keys]
    failed: dict[str, str] = {}
    torch_info: dict = {"torch": hello["torch"]}
    try:
        say(f"waiting for the torch worker's warm-up (compiles; up to {args.worker_timeout:.0f} s)")
        torch_info.update(worker.recv(args.worker_timeout, "ready"))
        failed.update(torch_info["failed"])
    except WorkerError as exc:
        failed.update({n: f"torch worker: {exc}" for n in torch_names})
        torch_info["arms"] = []
        say(f"TORCH WORKER FAILED: {exc}")
    data, run_order = interleave(args, arms, contexts, prompts, worker, torch_info["arms"],
                                 failed)
    if [n for n in torch_info["arms"] if n not in failed]:
        try:
            worker.send({"cmd": "quit"})
            torch_info["compile_counters"] = worker.recv(60.0, "bye")["compile_counters"]
        except (WorkerError, OSError):
            pass
    res = record(args, model, contexts, prompts, arms, data, oracle, failed, torch_names,
                 torch_info, run_order, t_start)
    from lab.files import atomic_write_text
    path = out_dir / "peer.json"
    atomic_write_text(path, json.dumps(res, indent=2, default=_jsonable))
    print(f"\n== peer ==\n{report.format_peer(res)}", flush=True)
    if not res["tokens_check"]["ok"]:
        print("TOKENS MISMATCH: the arms did not all generate the same ids (see above and "
              "tokens_check in peer.json)", flush=True)
    for p in res["problems"]:
        print(f"PROBLEM: {p}", flush=True)
    print(f"wrote {path} in {res['wall_s']:.0f} s", flush=True)
    return 0 if res["ok"] else 1


def lab_arms(model, backend: str, contexts, prompts, tokens: int) -> dict:
    """{(arm name, context): bench.Arm}, all on ONE engine where the toggles allow (as
    lab/bench.py's arms share one), each warmed up once at each context."""
    from lab import bench
    cfgs = lab_configs(backend)
    pool: dict = {}
    arms = {}
    for i, (name, cfg) in enumerate(cfgs.items()):
        for c in contexts:
            arm = bench.make_arm(model, name, cfg, i, pool=pool)
            try:
                arm.use()
            except LabError:               # a toggle that changes allocation: its own engine
                arm = bench.make_arm(model, name, cfg, i)
            arms[(name, c)] = arm
    say(f"lab arms: {', '.join(cfgs)} on {next(iter(arms.values())).engine.backend.describe()}")
    if "lab graph+pdl+fusion" not in cfgs:
        say("lab/config.py has no fusion toggle: no graph+pdl+fusion arm")
    for c in contexts:
        _, ids = prompts[c]
        for name in cfgs:
            t0 = time.perf_counter()
            lab_run(ids, tokens)(arms[(name, c)].use())
            say(f"{name} warmed up at context {c} in {time.perf_counter() - t0:.1f} s")
    return arms


def interleave(args, arms, contexts, prompts, worker, torch_live, failed):
    """The reps: rep i runs the lab arms here and the torch arms in the worker, the lab first on
    even reps; each side rotates its arm order per rep. A worker that fails stops its arms (they
    go to `failed`); the lab's reps go on. Returns (data, run order)."""
    lab_names = list(dict.fromkeys(name for name, _ in arms))
    torch_live = [n for n in torch_live if n not in failed]
    data: dict = {n: {str(c): {"ms": [], "tokens": []} for c in contexts}
                  for n in lab_names + torch_live}
    run_order = []
    for rep in range(args.reps):
        lab_order = rotated(lab_names, rep)
        done = []
        for side in (("lab", "torch") if rep % 2 == 0 else ("torch", "lab")):
            if side == "lab":
                for c in contexts:
                    _, ids = prompts[c]
                    for name in lab_order:
                        arm = arms[(name, c)]
                        arm.timed(lab_run(ids, args.tokens))
                        data[name][str(c)]["ms"].append(arm.ms[-1])
                        data[name][str(c)]["tokens"].append(arm.runs[-1])
                done.append("lab: " + ", ".join(lab_order))
                continue
            if not torch_live:
                continue
            try:
                worker.send({"cmd": "rep", "rep": rep})
                msg = worker.recv(args.worker_timeout, f"rep {rep}")
            except (WorkerError, OSError) as exc:
                for n in torch_live:
                    failed[n] = f"torch worker at rep {rep}: {exc}"
                    data.pop(n, None)
                torch_live = []
                say(f"TORCH WORKER FAILED: {exc}")
                continue
            for n, per_ctx in msg["data"].items():
                for c, d in per_ctx.items():
                    data[n][c]["ms"].append(d["ms"])
                    data[n][c]["tokens"].append(d["tokens"])
            done.append("torch: " + ", ".join(msg["order"]))
        run_order.append(done)
        first = str(contexts[0])
        cells = [f"{n} {np.mean(d[first]['ms']):.4f}" for n, d in data.items() if d[first]["ms"]]
        say(f"rep {rep + 1}/{args.reps} done ({'; '.join(done)}); running mean ms/token at "
            f"context {contexts[0]}: {', '.join(cells)}")
    return data, run_order


def record(args, model, contexts, prompts, arms, data, oracle, failed, torch_names, torch_info,
           run_order, t_start) -> dict:
    """peer.json's content: provenance, the method, and summarize()'s statistics and checks,
    with the lab arms' replay gate (lab/bench.py) and the compile arm's CUDA-graph skips."""
    from lab.bench import arm_mode, replay_fraction
    lab_names = list(dict.fromkeys(name for name, _ in arms))
    problems = []
    for (name, c), arm in arms.items():
        f = replay_fraction(arm.outcomes)
        row = data[name][str(c)]
        row.update({"replay_fraction": f, "mode": arm_mode(True, f),
                    "ledger": dict(arm.outcomes), "toggles": arm.cfg.toggles()})
        if row["mode"] != "graph":
            problems.append(f"{name} at context {c} is not a graph arm (ledger {row['ledger']})")
    arm_order = lab_names + torch_names
    summary = summarize(contexts, arm_order, data, oracle, failed)
    for c in contexts:
        ref = summary["tokens_check"]["reference"][str(c)]
        if ref["ids"] is not None:
            ref["text"] = model.tokenizer.decode(ref["ids"])
    warnings = []
    counters = torch_info.get("compile_counters") or {}
    if COMPILE_ARM in torch_info.get("arms", []) and args.torch_device.startswith("cuda") \
            and counters.get("cudagraph_skips"):
        why = (counters.get("cudagraph_skip_reasons") or ["see the worker's log"])[0]
        warnings.append(f"torch.compile skipped CUDA graphs {counters['cudagraph_skips']} "
                        f"time(s), so its arm ran (partly) without them: {why}")
    backend = next(iter(arms.values())).engine.backend
    versions = lab_versions(backend)
    tsrc = (f"PyTorch {torch_info['torch']} (CUDA {torch_info.get('torch_cuda')}) on "
            f"{torch_info.get('device_name', '?')}")
    lengths = window_lengths(contexts, args.tokens, model.cfg.max_seq, args.buckets)
    buckets = ("the torch step's attention reads the first L cache rows and masks those past "
               "the device position; L = max(128, next power of two >= position + 1), capped "
               "at max_seq: one torch.cuda.CUDAGraph per L (every L the prefill meets), one "
               "torch.compile specialisation per L the windows meet"
               if args.buckets == "pow2" else
               "the torch step's attention reads all max_seq cache rows and masks those past "
               "the device position: one graph serves every position")
    res = {
        "what": "decode-lab's graph arms against a PyTorch peer (eager, torch.cuda.CUDAGraph, "
                "torch.compile reduce-overhead) of the same model from the same weight file: "
                "ms/token at each context, greedy tokens compared",
        "source": f"{versions['describe']}; {tsrc}",
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "recorded_by": RECORDED_BY,
        "versions": {**{k: v for k, v in versions.items() if k != "describe"},
                     "torch": torch_info["torch"], "torch_cuda": torch_info.get("torch_cuda"),
                     "torch_device": torch_info.get("device_name"),
                     "python": platform.python_version()},
        "weights": {"file": Path(args.weights).name, "sha256": sha256_of(Path(args.weights))},
        "method": {
            "reps": args.reps, "tokens_per_rep": args.tokens, "contexts": contexts,
            "compile_arm": COMPILE_ARM,
            "context": "context c: the prompt is c + 1 characters of data/corpus.txt from "
                       f"offset {args.prompt_offset}, fed one position per step (untimed); "
                       "the timed window is the next `tokens_per_rep` steps, at positions "
                       "c .. c + tokens_per_rep - 1",
            "prefill": "each lab arm runs its own prefill through its own step every run; the "
                       "torch arms share one prefill per context per rep (the cudagraph arm's "
                       "graphs on a GPU, eager steps otherwise) and each rewinds to the "
                       "prompt's end before its window (generated ids cleared)",
            "timing": "ms/token = wall time of the window / tokens, synchronised at its two "
                      "ends only (lab: engine.decode on the backend clock; torch: "
                      "torch.cuda.synchronize around time.perf_counter), garbage collector "
                      "off; one untimed warm-up run per arm and context first",
            "interleaving": "rep i runs the lab arms in this process and the torch arms in "
                            "the worker, the lab first on even reps and the worker first on "
                            "odd ones; each side's arm order is rotated per rep",
            "process_separation": "torch arms ran in a separate process (this script "
                                  "re-invoked with --torch-worker; JSON lines over a pipe); "
                                  "the lab's process never imports torch",
            "why_separate": "once torch has run kernels in a process, every later CUDA graph "
                            "node in that process (numba's too) replays about 0.18 us slower",
            "dtype": "float32 (weights, activations, KV cache) in every arm",
            "tf32": torch_info.get("settings", {}),
            "argmax": "greedy, on the device, inside the step (lab: argmax_next; torch: "
                      "torch.argmax, written to a device token buffer)",
            "graph_bucketing": {
                "scheme": args.buckets, "min_bucket": MIN_BUCKET, "description": buckets,
                "window_lengths": {str(c): v for c, v in lengths.items()},
                "cudagraph_buckets_captured": torch_info.get("cudagraph_buckets", []),
                "lab": "the lab's attention reads exactly position + 1 rows (one graph per "
                       "plan key: split count per position range)"},
            "arms": {**{n: LAB_WHAT[n] for n in lab_names},
                     **{n: TORCH_WHAT[n] for n in torch_names}},
            "fusion_arm": "lab graph+pdl+fusion" in lab_names,
        },
        "prompts": {str(c): {"offset": args.prompt_offset, "chars": len(t), "text": t}
                    for c, (t, _) in prompts.items()},
        "arm_order": arm_order,
        **summary,
        "run_order": run_order,
        "torch_worker": {"warmup_s": torch_info.get("warmup_s", {}),
                         "compile_counters": counters, "python": torch_info.get("python")},
        "problems": problems,
        "warnings": warnings,
        "wall_s": time.perf_counter() - t_start,
    }
    res["ok"] = summary["ok"] and not problems
    return res


def _jsonable(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (set, frozenset, tuple)):
        return list(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


if __name__ == "__main__":
    sys.exit(main())
