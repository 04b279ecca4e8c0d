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


class Reference:
    """Greedy decode in float64. `step(token, pos)` returns the logits for the next position."""

    def __init__(self, model: Model):
        self.cfg = c = model.cfg
        self.w = {k: v.astype(np.float64) for k, v in model.weights.items()}
        self.cos, self.sin = rope_tables(c.head_dim, c.max_seq, c.rope_theta)
        shape = (c.n_layer, c.max_seq, c.n_head, c.head_dim)
        self.k_cache = np.zeros(shape)
        self.v_cache = np.zeros(shape)

    def step(self, token: int, pos: int) -> np.ndarray:
        c, w = self.cfg, self.w
        D, H, hd = c.d_model, c.n_head, c.head_dim
        x = w["tok_emb"][token].copy()
        for i in range(c.n_layer):
            h = rmsnorm(x, w[f"layers.{i}.attn_norm"], c.norm_eps)
            qkv = w[f"layers.{i}.wqkv"] @ h
            q = rope(qkv[:D].reshape(H, hd), self.cos[pos], self.sin[pos])
            self.k_cache[i, pos] = rope(qkv[D:2 * D].reshape(H, hd), self.cos[pos], self.sin[pos])
            self.v_cache[i, pos] = qkv[2 * D:].reshape(H, hd)
            k, v = self.k_cache[i, :pos + 1], self.v_cache[i, :pos + 1]  # [T, H, hd]
            s = np.einsum("hd,thd->ht", q, k) / np.sqrt(hd)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            att = np.einsum("ht,thd->hd", p, v).reshape(D)
            x = x + w[f"layers.{i}.wo"] @ att
            h = rmsnorm(x, w[f"layers.{i}.mlp_norm"], c.norm_eps)
            g = w[f"layers.{i}.w_gate"] @ h
            x = x + w[f"layers.{i}.w_down"] @ (g / (1.0 + np.exp(-g)) * (w[f"layers.{i}.w_up"] @ h))
        return w["lm_head"] @ rmsnorm(x, w["final_norm"], c.norm_eps)


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
