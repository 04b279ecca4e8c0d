"""The tiny model: its shapes, weight loading with validation, and the character tokenizer.

`load_model()` reads `data/tiny_model.json` (shapes, vocabulary, checksum) and
`data/tiny_model.npz` (float32 weights) and refuses anything that does not match: a missing
file, a checksum mismatch, a missing or extra array, a wrong shape or dtype. Every refusal is a
`LabError` that says which file and what is wrong.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lab.errors import LabError

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
DEFAULT_WEIGHTS = DATA_DIR / "tiny_model.npz"


@dataclass(frozen=True)
class ModelConfig:
    vocab: str
    d_model: int
    n_layer: int
    n_head: int
    d_ff: int
    max_seq: int
    rope_theta: float
    norm_eps: float

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every array the weight file must hold, with its shape ([out, in] for matrices)."""
        D, F, V = self.d_model, self.d_ff, self.vocab_size
        shapes = {"tok_emb": (V, D), "final_norm": (D,), "lm_head": (V, D)}
        for i in range(self.n_layer):
            shapes.update({
                f"layers.{i}.attn_norm": (D,), f"layers.{i}.wqkv": (3 * D, D),
                f"layers.{i}.wo": (D, D), f"layers.{i}.mlp_norm": (D,),
                f"layers.{i}.w_gate": (F, D), f"layers.{i}.w_up": (F, D),
                f"layers.{i}.w_down": (D, F),
            })
        return shapes


class Tokenizer:
    """Characters <-> ids over the model's vocabulary (a string of distinct characters)."""

    def __init__(self, vocab: str):
        self.vocab = vocab
        self._ids = {ch: i for i, ch in enumerate(vocab)}

    def encode(self, text: str) -> np.ndarray:
        bad = sorted({ch for ch in text if ch not in self._ids})
        if bad:
            shown = ", ".join(repr(ch) for ch in bad[:10])
            raise LabError(f"prompt has {len(bad)} character(s) outside the model's vocabulary: "
                           f"{shown}; allowed: {self.vocab!r}")
        if not text:
            raise LabError("the prompt is empty; give at least one character")
        return np.array([self._ids[ch] for ch in text], dtype=np.int32)

    def decode(self, ids) -> str:
        return "".join(self.vocab[int(i)] for i in ids)


@dataclass(frozen=True)
class Model:
    cfg: ModelConfig
    weights: dict[str, np.ndarray]
    tokenizer: Tokenizer
    source: str  # where the weights came from, for provenance lines

    def layer(self, i: int, name: str) -> np.ndarray:
        return self.weights[f"layers.{i}.{name}"]


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# each field of a model description: its JSON type(s) and the least value it may take
_FIELD_RULES = {"d_model": (int, 2), "n_layer": (int, 1), "n_head": (int, 1), "d_ff": (int, 1),
                "max_seq": (int, 2),       # a prompt token and the token after it
                "rope_theta": ((int, float), 0.0), "norm_eps": ((int, float), 0.0)}


def _check_fields(meta: dict, name: str) -> None:
    """Types and ranges of a description's fields, each refusal naming the field: a string where
    a number belongs would otherwise surface as a TypeError deep in the engine, and max_seq 0
    as a failure at the first step."""
    if not isinstance(meta.get("vocab"), str):
        raise LabError(f"{name}: vocab must be a string of distinct characters, "
                       f"got {meta.get('vocab')!r}")
    for field, (kinds, least) in _FIELD_RULES.items():
        v = meta[field]
        if isinstance(v, bool) or not isinstance(v, kinds):
            kind = "an integer" if kinds is int else "a number"
            raise LabError(f"{name}: {field} must be {kind}, got {v!r} ({type(v).__name__})")
        if kinds is int and v < least:
            raise LabError(f"{name}: {field} = {v} must be at least {least}")
        if kinds is not int and not (np.isfinite(v) and v > least):
            raise LabError(f"{name}: {field} = {v!r} must be a finite number > 0")


def _read_config(meta_path: Path) -> tuple[ModelConfig, str | None]:
    if not meta_path.is_file():
        raise LabError(f"model description {meta_path.name} not found next to the weights")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LabError(f"model description {meta_path.name} is unreadable: {exc}") from None
    if not isinstance(meta, dict):
        raise LabError(f"model description {meta_path.name}: expected a JSON object, "
                       f"got {type(meta).__name__}")
    missing = [k for k in ModelConfig.__dataclass_fields__ if k not in meta]
    if missing:
        raise LabError(f"model description {meta_path.name} lacks {', '.join(missing)}")
    _check_fields(meta, meta_path.name)
    cfg = ModelConfig(**{k: meta[k] for k in ModelConfig.__dataclass_fields__})
    if len(set(cfg.vocab)) != len(cfg.vocab) or not cfg.vocab:
        raise LabError(f"{meta_path.name}: vocab must be a non-empty string of distinct characters")
    if cfg.d_model % cfg.n_head or cfg.head_dim % 2:
        raise LabError(f"{meta_path.name}: d_model must split into n_head heads of even size")
    return cfg, meta.get("sha256")


def load_model(path: str | Path = DEFAULT_WEIGHTS, verify_checksum: bool = True) -> Model:
    """Load and validate the weights at `path` (an .npz) and the .json beside it."""
    path = Path(path)
    if path.is_dir():
        raise LabError(f"weights {path} is a folder; give the .npz file (the repository ships "
                       f"data/tiny_model.npz)")
    if not path.is_file():
        raise LabError(f"weights file {path} not found (the repository ships data/tiny_model.npz)")
    cfg, expected = _read_config(path.with_suffix(".json"))
    if verify_checksum:
        if expected is None:
            raise LabError(f"model description {path.with_suffix('.json').name} records no "
                           f"sha256 of {path.name}; add \"sha256\": the file's checksum "
                           f"(lab.model.sha256_of)")
        actual = sha256_of(path)
        if actual != expected:
            raise LabError(f"weights file {path.name} is corrupt: sha256 {actual[:16]}... does not "
                           f"match the recorded {str(expected)[:16]}...")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except Exception as exc:  # a truncated or non-npz file: numpy raises several types
        why = ("not an .npz archive (numpy read it as a pickle)" if "allow_pickle" in str(exc)
               else str(exc))
        raise LabError(f"weights file {path.name} is unreadable: {why}") from None
    return Model(cfg, validate_weights(cfg, arrays), Tokenizer(cfg.vocab), str(path.name))


def validate_weights(cfg: ModelConfig, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Check names, shapes, dtypes and finiteness; return C-contiguous float32 arrays."""
    want = cfg.weight_shapes()
    missing = sorted(set(want) - set(arrays))
    extra = sorted(set(arrays) - set(want))
    if missing or extra:
        raise LabError(f"weights do not match the model: missing {missing[:5]}, unexpected {extra[:5]}")
    out = {}
    for name, shape in want.items():
        a = arrays[name]
        if a.dtype != np.float32:
            raise LabError(f"weight {name} has dtype {a.dtype}; expected float32")
        if a.shape != shape:
            raise LabError(f"weight {name} has shape {a.shape}; expected {shape}")
        if not np.isfinite(a).all():
            raise LabError(f"weight {name} holds NaN or infinite values")
        out[name] = np.ascontiguousarray(a)
    return out


def random_model(cfg: ModelConfig, seed: int = 0) -> Model:
    """A model with random weights at any shape: for tests of shapes the real model lacks."""
    rng = np.random.default_rng(seed)
    w = {}
    for name, shape in cfg.weight_shapes().items():
        if len(shape) == 1:
            w[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            w[name] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
    return Model(cfg, w, Tokenizer(cfg.vocab), f"random(seed={seed})")


def check_request(cfg: ModelConfig, prompt_ids, n_tokens: int) -> np.ndarray:
    """The prompt as int32 ids, after the checks every decoder shares (the engine and the float64
    reference): a non-empty 1-D prompt of known ids, n_tokens >= 0, prompt + tokens <= max_seq."""
    ids = np.asarray(prompt_ids, dtype=np.int32)
    if ids.ndim != 1 or ids.size == 0:
        raise LabError("the prompt must be a non-empty sequence of token ids")
    if ids.min() < 0 or ids.max() >= cfg.vocab_size:
        raise LabError(f"token ids must lie in [0, {cfg.vocab_size})")
    if n_tokens < 0:
        raise LabError("the number of tokens to generate must be >= 0")
    if ids.size + n_tokens > cfg.max_seq:
        raise LabError(f"prompt ({ids.size}) + tokens ({n_tokens}) = {ids.size + n_tokens} "
                       f"exceeds the model's max_seq {cfg.max_seq}")
    return ids
