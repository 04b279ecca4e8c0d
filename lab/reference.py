"""The oracle: a float64 NumPy forward pass of one decode step with a KV cache, and greedy
generation on top of it. Written for clarity, not speed; every other path is checked against it.
"""
from __future__ import annotations

import numpy as np

from lab.model import Model, check_request


def rope_tables(head_dim: int, max_seq: int, theta: float, dtype=np.float64):
    """cos/sin tables [max_seq, head_dim // 2] for the rotate-half convention."""
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.arange(max_seq, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x) + eps) * w


def rope(x, cos, sin):  # x [n_head, head_dim]; cos/sin [head_dim // 2]
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def _unwatched(where: str, a: np.ndarray) -> np.ndarray:
    return a


class Reference:
    """Greedy decode in float64. `step(token, pos)` returns the logits for the next position.

    `dtype` / `kv_dtype` (float32 / float16 for `first_non_finite`'s re-run: the engine's element
    types) and `watch(where, array)`, called on every intermediate with its name ("layer 2
    w_gate") and returning it, exist for diagnosis; the oracle is the float64 default."""

    def __init__(self, model: Model, dtype=np.float64, kv_dtype=None, watch=_unwatched):
        self.cfg = c = model.cfg
        self.w = {k: v.astype(dtype) for k, v in model.weights.items()}
        self.cos, self.sin = rope_tables(c.head_dim, c.max_seq, c.rope_theta, dtype)
        shape = (c.n_layer, c.max_seq, c.n_head, c.head_dim)
        self.k_cache = np.zeros(shape, kv_dtype or dtype)
        self.v_cache = np.zeros(shape, kv_dtype or dtype)
        self.watch = watch
        self.real = np.dtype(dtype).type       # sqrt(head_dim) in the step's type (NumPy 2 would
                                               # promote float32 scores by a float64 scalar)

    def step(self, token: int, pos: int) -> np.ndarray:
        c, w, seen = self.cfg, self.w, self.watch
        D, H, hd = c.d_model, c.n_head, c.head_dim
        x = seen("tok_emb", w["tok_emb"][token].copy())
        for i in range(c.n_layer):
            at = f"layer {i}"
            h = seen(f"{at} attn_norm", rmsnorm(x, w[f"layers.{i}.attn_norm"], c.norm_eps))
            qkv = seen(f"{at} wqkv", w[f"layers.{i}.wqkv"] @ h)
            q = rope(qkv[:D].reshape(H, hd), self.cos[pos], self.sin[pos])
            self.k_cache[i, pos] = rope(qkv[D:2 * D].reshape(H, hd), self.cos[pos], self.sin[pos])
            self.v_cache[i, pos] = qkv[2 * D:].reshape(H, hd)
            k = seen(f"{at} K cache ({self.k_cache.dtype})", self.k_cache[i, :pos + 1])  # [T, H, hd]
            v = seen(f"{at} V cache ({self.v_cache.dtype})", self.v_cache[i, :pos + 1])
            s = seen(f"{at} attention scores", np.einsum("hd,thd->ht", q, k) / self.real(np.sqrt(hd)))
            p = np.exp(s - s.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            att = seen(f"{at} attention", np.einsum("ht,thd->hd", p, v).reshape(D))
            x = seen(f"{at} wo (residual)", x + w[f"layers.{i}.wo"] @ att)
            h = seen(f"{at} mlp_norm", rmsnorm(x, w[f"layers.{i}.mlp_norm"], c.norm_eps))
            g = seen(f"{at} w_gate", w[f"layers.{i}.w_gate"] @ h)
            u = seen(f"{at} w_up", w[f"layers.{i}.w_up"] @ h)
            x = seen(f"{at} w_down (residual)", x + w[f"layers.{i}.w_down"] @ (g / (1.0 + np.exp(-g)) * u))
        h = seen("final_norm", rmsnorm(x, w["final_norm"], c.norm_eps))
        return seen("lm_head (logits)", w["lm_head"] @ h)


def generate(model: Model, prompt_ids, n_tokens: int, return_logits: bool = False):
    """Greedy generation: feed the prompt, then `n_tokens` argmax tokens.

    Returns all token ids (prompt + generated) and, if asked, the logits of every step that
    produced a generated token ([n_tokens, vocab], float64).
    """
    prompt_ids = check_request(model.cfg, prompt_ids, n_tokens)
    ref = Reference(model)
    tokens = [int(t) for t in prompt_ids]
    logits_out = []
    for pos in range(len(tokens) - 1 + n_tokens):
        logits = ref.step(tokens[pos], pos)
        if pos + 1 >= len(prompt_ids):
            tokens.append(int(np.argmax(logits)))
            logits_out.append(logits)
    tokens = np.array(tokens, dtype=np.int32)
    return (tokens, np.array(logits_out)) if return_logits else tokens


class _Leaves(Exception):
    def __init__(self, where: str):
        self.where = where


def first_non_finite(model: Model, tokens, steps: int, kv_dtype=np.float32) -> str:
    """The diagnostic re-run behind a non-finite decode: the engine's `steps` steps over `tokens`
    (the ids it read and wrote) again on the host, in float32 with a `kv_dtype` cache (the
    engine's element types, NumPy's summation order), every intermediate checked. Returns a
    sentence naming the first step (its position) and the layer and part where a value stops
    being finite, or saying that the re-run stays finite (then the engine's non-finite values
    come from a kernel, not from float32's range). Host-only and after the fact: the step
    itself never syncs to check."""

    def watch(where, a):
        if not np.isfinite(a).all():
            raise _Leaves(where)
        return a

    ref = Reference(model, np.float32, np.dtype(kv_dtype), watch)
    with np.errstate(all="ignore"):
        for pos in range(steps):
            try:
                ref.step(int(tokens[pos]), pos)
            except _Leaves as leave:
                return (f"a float32 re-run of the same tokens on the host first leaves the finite "
                        f"range at the step at position {pos}, {leave.where}")
    return (f"a float32 re-run of the same tokens on the host stays finite through all {steps} "
            f"steps: the non-finite values come from a kernel, not from float32's range "
            f"(`python -m kernels.check` holds each kernel to its NumPy twin)")
