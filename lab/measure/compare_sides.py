"""One side of a comparison (lab/measure/compare.py): its run spec, and its decode of the common
input.

A run spec is `reference` (the float64 oracle, lab/reference.py) or an engine given by a backend
and/or LAB_* toggles, parsed like bench arms. `run_side` decodes greedily or is fed the other
side's ids (teacher forcing) and keeps the logits of every generated step, the weights' sha256
and, for an engine, the ids its device buffer held and the engine itself
(lab/measure/compare_evidence.py reads its record).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from lab import reference
from lab.config import TOGGLES, LabConfig
from lab.errors import LabError
from lab.model import DATA_DIR, Model, sha256_of

REFERENCE = "reference"
_BACKENDS = next(allowed for var, _, allowed, _, _ in TOGGLES if var == "LAB_BACKEND")


# ---- run specs ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunSpec:
    text: str                      # as given
    cfg: LabConfig | None          # None: the float64 oracle

    @property
    def is_reference(self) -> bool:
        return self.cfg is None

    def describe(self) -> str:
        if self.is_reference:
            return "reference (float64 oracle)"
        return " ".join(f"{k[4:]}={v}" for k, v in self.cfg.toggles().items())


def _shown(path) -> str:
    """A weights path as results record it: relative to the project when the file is in it (a
    recorded result names no machine's folders), else as given."""
    p = Path(path).resolve()
    root = DATA_DIR.parent
    return str(p.relative_to(root)) if p.is_relative_to(root) else str(path)


def parse_spec(text: str, base: LabConfig) -> RunSpec:
    """`reference`, a backend name, and/or LAB_NAME=VALUE toggles, comma-separated."""
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if [x.lower() for x in items] == [REFERENCE]:
        return RunSpec(text, None)
    if REFERENCE in (x.lower() for x in items):
        raise LabError(f"run spec {text!r}: {REFERENCE!r} is the float64 oracle and takes no "
                       f"backend or toggles")
    toggles = []
    for item in items:
        if "=" in item:
            toggles.append(item)
        elif item.lower() in _BACKENDS:
            toggles.append(f"LAB_BACKEND={item.lower()}")
        else:
            raise LabError(f"run spec {text!r}: unknown item {item!r}; give {REFERENCE!r} (alone), "
                           f"a backend ({'|'.join(_BACKENDS)}) or LAB_NAME=VALUE toggles")
    try:
        from .bench import parse_arm   # the engine's imports, only when a run is built
        return RunSpec(text, parse_arm(",".join(toggles), base, who=""))
    except LabError as exc:
        raise LabError(f"run spec {text!r}: {exc}") from None


# ---- running a side ----------------------------------------------------------------------------
@dataclass
class Run:
    """One side's decode of the common input: the logits of every generated step."""
    label: str                 # "A", "B", or a name
    spec: RunSpec
    weights: str               # the weights file (relative to the project when inside it)
    sha256: str
    source: str                # where the numbers come from
    ids: np.ndarray            # prompt + generated ids, the input both sides are fed
    n_prompt: int
    logits: np.ndarray         # [steps, vocab] float64: step s predicts ids[n_prompt + s]
    fed: np.ndarray | None = None    # the ids the side's device buffer held (engines only)
    engine: object = field(default=None, repr=False)


def _bar(it, desc: str, progress):
    if progress is False:
        return it
    from tqdm.auto import tqdm
    return tqdm(it, desc=desc, unit="step", disable=None if progress is None else False,
                delay=0.0 if progress else 1.0, leave=True)


def _reference_logits(model: Model, ids: np.ndarray, n_prompt: int, progress=False) -> np.ndarray:
    ref = reference.Reference(model)
    out = []
    for pos in _bar(range(len(ids) - 1), "reference", progress):
        logits = ref.step(int(ids[pos]), pos)
        if pos + 1 >= n_prompt:
            out.append(logits)
    return np.array(out)


def _engine_logits(engine, ids: np.ndarray, n_new: int, n_prompt: int, desc: str,
                   progress=False) -> np.ndarray:
    """Reset with `ids` (as the prompt) and `n_new` tokens to generate, step through, and
    download the logits of every step that predicts a position >= n_prompt."""
    engine.reset(ids, n_new)
    out = []
    for pos in _bar(range(len(ids) - 1 + n_new), desc, progress):
        engine.step()
        if pos + 1 >= n_prompt:
            out.append(engine.logits().astype(np.float64))
    return np.array(out)


def run_side(label: str, spec: RunSpec, model: Model, weights, prompt_ids, tokens: int = 0,
             feed: np.ndarray | None = None, engine_factory: Callable | None = None,
             progress=False, whole: bool = False) -> Run:
    """Decode `tokens` tokens greedily after `prompt_ids` (feed=None), or be fed the ids `feed`
    (teacher forcing: prompt_ids, then the generated part of `feed`). `whole`: an engine side
    decodes the whole generation as `generate` does (LAB_LOOP=device: one launch of the device
    loop) and keeps its ids only -- no step's logits (logits [0, vocab])."""
    n_prompt = len(prompt_ids)
    sha = _sha256(Path(weights))
    if spec.is_reference:
        if feed is None:
            ids, logits = reference.generate(model, prompt_ids, tokens, return_logits=True)
        else:
            ids, logits = feed, _reference_logits(model, feed, n_prompt, progress)
        return Run(label, spec, _shown(weights), sha, "float64 NumPy oracle (lab/reference.py), CPU",
                   np.asarray(ids, np.int32), n_prompt, np.asarray(logits, np.float64))
    engine = (engine_factory or _default_engine)(model, spec.cfg)
    if whole and feed is None:
        engine.reset(np.asarray(prompt_ids), tokens)
        engine.decode(n_prompt - 1 + tokens)
        ids = engine.tokens(n_prompt + tokens)
        return Run(label, spec, _shown(weights), sha, engine.backend.describe(),
                   np.asarray(ids, np.int32), n_prompt,
                   np.zeros((0, model.cfg.vocab_size), np.float64), fed=ids, engine=engine)
    if feed is None:
        logits = _engine_logits(engine, np.asarray(prompt_ids), tokens, n_prompt, label, progress)
        ids = engine.tokens(n_prompt + tokens)
    else:
        logits = _engine_logits(engine, feed, 0, n_prompt, label, progress)
        ids = feed
    return Run(label, spec, _shown(weights), sha, engine.backend.describe(), np.asarray(ids, np.int32),
               n_prompt, logits, fed=engine.tokens(len(ids)), engine=engine)


def _sha256(path: Path) -> str:
    """sha256 of a file, computed once per (path, size, modification time)."""
    st = path.stat()
    return _sha256_cached(str(path.resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    return sha256_of(Path(path))


def _default_engine(model: Model, cfg: LabConfig):
    from lab.engine.runner import DecodeEngine
    return DecodeEngine(model, cfg)
