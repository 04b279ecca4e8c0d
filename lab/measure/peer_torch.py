"""The lab's model in PyTorch, for the peer experiment (lab/measure/experiments/peer.py): the
decoder, the four ways the peer runs it (eager, one torch.cuda.CUDAGraph per attention-length
bucket, torch.compile reduce-overhead, and inductor's kernels captured in one torch.cuda.CUDAGraph
per bucket), the float32 settings, and torch.compile's counters.

Importing this needs no torch: torch is imported inside the functions that build or run the
model, which only the torch worker (lab/measure/peer_worker.py) and the tests with torch call.
"""
from __future__ import annotations

import functools
import math

import numpy as np

MIN_BUCKET = 128
TORCH_ARMS = {"eager": "torch eager", "graph": "torch cudagraph", "compile": "torch.compile",
              "inductor": "torch inductor in one graph"}
COMPILE_ARM = TORCH_ARMS["compile"]
STRONGEST_ARM = TORCH_ARMS["inductor"]     # the peer the lab's best arm is held against
TORCH_WHAT = {
    "torch eager": "eager torch ops, static preallocated KV cache (index_copy_ at the device "
                   "position), argmax on the device",
    "torch cudagraph": "the eager step captured with torch.cuda.CUDAGraph (warm-up on a side "
                       "stream, capture on it), one graph per attention-length bucket, "
                       "replayed with graph.replay()",
    "torch.compile": 'torch.compile(step, mode="reduce-overhead", fullgraph=True, '
                     "dynamic=False): one specialisation (and CUDA graph) per attention-length "
                     "bucket; torch.compiler.cudagraph_mark_step_begin() before each step",
    "torch inductor in one graph": 'torch.compile(step, mode="max-autotune-no-cudagraphs", '
                                   "fullgraph=True, dynamic=False): inductor's kernels, warmed "
                                   "up (compiled) on a side stream, then captured once per "
                                   "attention-length bucket in a torch.cuda.CUDAGraph and "
                                   "replayed with graph.replay(): no Python, guard or "
                                   "cudagraph-tree check between steps",
}


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


@functools.lru_cache(maxsize=None)
def torch_decoder_class():
    """The torch decoder class (defined inside a function so that importing this module needs
    no torch)."""
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
    """The torch cudagraph arm: one torch.cuda.CUDAGraph of `step(L)` per bucket L (`step`:
    the eager `dec.step` by default), each warmed up on a side stream and captured on it; `run`
    replays the position's bucket. `warmup_s[L]`: the seconds of L's warm-up (with a compiled
    `step`, its compile)."""

    def __init__(self, dec, lengths, warmup_steps: int = 3, step=None):
        import time

        import torch
        if dec.device_.type != "cuda":
            raise ValueError("torch.cuda.CUDAGraph needs a CUDA device")
        step = dec.step if step is None else step
        self.dec, self.graphs, self.warmup_s = dec, {}, {}
        stream = torch.cuda.Stream(device=dec.device_)
        for length in lengths:
            dec.reset([0])                         # warm-up steps write rows 0..: reset later
            t0 = time.perf_counter()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(warmup_steps):
                    step(length)
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            self.warmup_s[length] = time.perf_counter() - t0
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                step(length)
            self.graphs[length] = graph
        torch.cuda.synchronize()
        dec.reset([0])

    def run(self, steps: int) -> None:
        dec = self.dec
        dec.check_room(steps)
        for _ in range(steps):
            self.graphs[dec.length_at(dec.position)].replay()
            dec.position += 1


def inductor_graph_runner(dec, lengths, warmup_steps: int = 3) -> GraphRunner:
    """The strongest torch arm: inductor's kernels for the step (torch.compile without its own
    CUDA graphs, max-autotune's kernel choices), each bucket's compiled step warmed up on a
    side stream and captured ONCE in a torch.cuda.CUDAGraph, so a step is one graph replay:
    none of reduce-overhead's per-step Python (guards, cudagraph-tree bookkeeping).
    `warmup_s[L]` holds each bucket's compile and warm-up."""
    import torch
    if dec.device_.type != "cuda":
        raise ValueError("the inductor-in-one-graph arm needs a CUDA device")
    compiled = torch.compile(dec.step, mode="max-autotune-no-cudagraphs", fullgraph=True,
                             dynamic=False)
    return GraphRunner(dec, lengths, warmup_steps, step=compiled)


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


def torch_settings(torch) -> dict:
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


def keep_cudagraph_skips() -> None:
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


def compile_counters() -> dict:
    try:
        from torch._dynamo.utils import counters
    except Exception:
        return {}
    return {"cudagraph_skips": int(counters["inductor"].get("cudagraph_skips", 0)),
            "cudagraph_skip_reasons": list(_SKIP_REASONS),
            "unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
            "graph_breaks": int(sum(counters["graph_break"].values()))}

