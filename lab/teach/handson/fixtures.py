"""What the hands-on checks run on: a small model (one layer, 128 positions: three plans, so
plan boundaries at 32 and 64 are a few steps away), the same model with two layers (where a
layer's launch must use its own layer's weights: the fission exercises), fresh engines on the
chosen backend, and the clean engine's tokens to compare with. A check builds every engine it
uses itself, so nothing a solution does to one survives the check.
"""
from __future__ import annotations

import dataclasses
import functools
import string

import numpy as np

from lab.config import LabConfig
from lab.engine.runner import DecodeEngine
from lab.model import ModelConfig, random_model
from lab.plan import plan_boundaries

VOCAB = "\n !$&',-.3:;?" + string.ascii_letters
SMALL = ModelConfig(vocab=VOCAB, d_model=32, n_layer=1, n_head=2, d_ff=64, max_seq=128,
                    rope_theta=10000.0, norm_eps=1e-5)
PROMPT = "ROMEO.\n"
TOKENS = 70          # from a 7-token prompt: positions 6..75, across the boundaries at 32 and 64


TWO_LAYERS = dataclasses.replace(SMALL, n_layer=2)


@functools.lru_cache(maxsize=1)
def small_model():
    return random_model(SMALL, seed=3)


@functools.lru_cache(maxsize=1)
def two_layer_model():
    """SMALL with two layers: a launch that takes layer 0's weights in every layer decodes
    other tokens here (and is named by the checks that use it)."""
    return random_model(TWO_LAYERS, seed=3)


def cfg(backend: str = "sim", **changes) -> LabConfig:
    return LabConfig(backend=backend, **changes)


def engine(backend: str = "sim", model=None, **kw) -> DecodeEngine:
    """A fresh engine on the small model; `kw`: LabConfig fields, or `step=`, `kv_init=`,
    `engine_class=`."""
    step, kv_init = kw.pop("step", None), kw.pop("kv_init", "zeros")
    cls = kw.pop("engine_class", DecodeEngine)
    extra = {"step": step} if step is not None else {}
    return cls(model or small_model(), cfg(backend, **kw), kv_init=kv_init, **extra)


@functools.lru_cache(maxsize=8)
def clean_tokens(backend: str = "sim", tokens: int = TOKENS, prompt: str = PROMPT,
                 layers: int = 1) -> tuple:
    """Token ids of the clean engine, decoded eagerly: what every right solution reproduces."""
    eng = engine(backend, graph=False, model=two_layer_model() if layers == 2 else None)
    return tuple(int(t) for t in eng.generate(prompt, tokens).tokens)


def prompt_ids(model=None) -> np.ndarray:
    return (model or small_model()).tokenizer.encode(PROMPT)


def boundary_prompt(model=None) -> np.ndarray:
    """A prompt whose first decoded token is the last of its plan: the second token starts a new
    plan key (captured afresh), so a frozen value first goes stale at replay 3."""
    m = model or small_model()
    return np.resize(prompt_ids(m), plan_boundaries(m.cfg.max_seq)[0]).astype(np.int32)


def first_difference(got, want) -> int | None:
    """Index of the first differing token id (None: the same)."""
    got, want = list(got), list(want)
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return i
    return None if len(got) == len(want) else min(len(got), len(want))
