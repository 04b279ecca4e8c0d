"""The tiny model: its shapes, weight loading with validation, and the character tokenizer.

`load_model()` reads `data/tiny_model.json` (shapes, vocabulary, checksum) and
`data/tiny_model.npz` (float32 weights) and refuses anything that does not match: a missing
file, a checksum mismatch, a missing or extra array, a wrong shape or dtype, sizes past
SIZE_BOUNDS or past the memory the machine has, and weights whose float64 probe step
(`probe`) leaves float32's range. Every refusal is a `LabError` that says which file
and what is wrong.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lab.errors import LabError
from lab.schema import finite

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
DEFAULT_WEIGHTS = DATA_DIR / "tiny_model.npz"
CORPUS = DATA_DIR / "corpus.txt"     # the text the model was trained on


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
        if kinds is not int and not (finite(v) and v > least):
            raise LabError(f"{name}: {field} = {v!r} must be a finite number > 0")


# the largest value of each size a description may declare: the lab's kernels and its float64
# reference are written for small models (data/tiny_model.json), and a size past these is a typo
# or another file, refused before anything is allocated for it
SIZE_BOUNDS = {"d_model": 1 << 14, "n_layer": 1 << 8, "n_head": 1 << 10, "d_ff": 1 << 16,
               "max_seq": 1 << 20, "vocab": 1 << 16}


def bytes_needed(cfg: ModelConfig) -> int:
    """Bytes a model of this shape takes to decode, counting what the lab allocates for it: the
    float32 weights and the reference's float64 copy, the engine's float32 KV cache and the
    reference's float64 one (two tensors of n_layer x max_seq x d_model each), and the rope
    tables (float64 angles, cos and sin, and the engine's float32 pair)."""
    params = sum(int(np.prod(s)) for s in cfg.weight_shapes().values())
    kv = 2 * cfg.n_layer * cfg.max_seq * cfg.d_model
    rope = cfg.max_seq * (cfg.head_dim // 2)
    return params * (4 + 8) + kv * (4 + 8) + rope * (3 * 8 + 2 * 4)


def available_bytes() -> int | None:
    """Memory this machine can give (MemAvailable, else the physical memory); None if unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def check_sizes(cfg: ModelConfig, name: str) -> None:
    """Refuse (a LabError naming the file) a size past SIZE_BOUNDS, or a model whose decode
    would need more memory than the machine has (bytes_needed against available_bytes)."""
    for field, bound in SIZE_BOUNDS.items():
        v = cfg.vocab_size if field == "vocab" else getattr(cfg, field)
        if v > bound:
            what = "vocab has" if field == "vocab" else f"{field} ="
            raise LabError(f"{name}: {what} {v}{' characters' if field == 'vocab' else ''}, past "
                           f"the lab's bound {bound} for it (a model of the lab's size: "
                           f"data/tiny_model.json)")
    need, have = bytes_needed(cfg), available_bytes()
    if have is not None and need > have:
        raise LabError(f"{name}: a model of max_seq {cfg.max_seq}, d_model {cfg.d_model}, "
                       f"n_layer {cfg.n_layer} needs about {need / 2**30:.1f} GiB of memory to "
                       f"decode (weights, KV caches, rope tables), more than the "
                       f"{have / 2**30:.1f} GiB this machine has available; lower max_seq")


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
    check_sizes(cfg, meta_path.name)
    return cfg, meta.get("sha256")


def weights_read(flag: str, given) -> dict[str, Path]:
    """The files a command reads for the weights `flag` names (`given`; None: DEFAULT_WEIGHTS,
    labelled `FLAG (default)`): the .npz and the description beside it, by label, for
    lab.files.refuse_overlap. An empty path, or one naming a folder, is a LabError naming the
    flag (never read as the default)."""
    from lab.files import refuse_empty
    refuse_empty({flag: given})
    path = Path(DEFAULT_WEIGHTS if given is None else given)
    if path.name in ("", ".", "..") or path.is_dir():
        raise LabError(f"{flag} {given}: is a folder; give the .npz file (the repository "
                       f"ships data/tiny_model.npz)")
    name = flag if given is not None else f"{flag} (default)"
    return {name: path, f"the description of {name}": path.with_suffix(".json")}


def load_model(path: str | Path = DEFAULT_WEIGHTS, verify_checksum: bool = True) -> Model:
    """Load and validate the weights at `path` (an .npz) and the .json beside it."""
    path = Path(path)
    if path.is_dir():
        raise LabError(f"weights {path} is a folder; give the .npz file (the repository ships "
                       f"data/tiny_model.npz)")
    if not path.is_file():
        raise LabError(f"weights file {path} not found (the repository ships data/tiny_model.npz)")
    if not path.with_suffix(".json").is_file():
        raise LabError(f"weights file {path}: its model description "
                       f"{path.with_suffix('.json').name} is not beside it (a model is an .npz "
                       f"and a .json of one name; the repository ships data/tiny_model.npz and "
                       f".json)")
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
    try:
        weights = validate_weights(cfg, arrays)
    except LabError as exc:         # name the file: the arrays' own check knows no path
        raise LabError(f"weights file {path.name} (against {path.with_suffix('.json').name}): "
                       f"{exc}") from None
    model = Model(cfg, weights, Tokenizer(cfg.vocab), str(path.name))
    probe(model)
    return model


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


F32_MAX = float(np.finfo(np.float32).max)


def probe(model: Model) -> None:
    """One decode step at position 0 for every token of the vocabulary at once, in float64, each
    intermediate held against float32's range: the engine computes in float32, so weights whose
    activations leave that range (or hold NaN) decode NaN logits and an argmax of garbage.
    Returns None for weights that stay in range; else a LabError naming the layer and the part
    where the step first leaves it. At position 0 rope is the identity (cos 1, sin 0) and each
    token attends to itself alone, so attention's output is its value row."""
    c = model.cfg
    D, H, hd = c.d_model, c.n_head, c.head_dim

    def w(name):
        return model.weights[name].astype(np.float64)

    def seen(a, where):
        m = float(np.max(np.abs(a)))
        if not m <= F32_MAX:        # NaN fails this too
            raise LabError(f"{model.source}: the weights' probe step (position 0, float64) "
                           f"reaches {m:.3g} at {where}, past float32's range ({F32_MAX:.3g}): "
                           f"the float32 engine would decode NaN or inf logits; weights refused")
        return a

    def norm(x, g, where):          # row-wise rmsnorm; its sum of squares is float32 on a device
        ss = seen(np.sum(x * x, axis=-1, keepdims=True), f"{where} (sum of squares)")
        return x / np.sqrt(ss / D + c.norm_eps) * g

    with np.errstate(all="ignore"):
        x = seen(w("tok_emb"), "tok_emb")                                   # [V, D]
        for i in range(c.n_layer):
            at = f"layer {i}"
            h = norm(x, w(f"layers.{i}.attn_norm"), f"{at} attn_norm")
            qkv = seen(h @ w(f"layers.{i}.wqkv").T, f"{at} wqkv")
            q, k, v = (qkv[:, j * D:(j + 1) * D].reshape(-1, H, hd) for j in range(3))
            seen((q * k).sum(axis=-1) / np.sqrt(hd), f"{at} attention scores")
            x = seen(x + v.reshape(-1, D) @ w(f"layers.{i}.wo").T, f"{at} wo (residual)")
            h = norm(x, w(f"layers.{i}.mlp_norm"), f"{at} mlp_norm")
            g = seen(h @ w(f"layers.{i}.w_gate").T, f"{at} w_gate")
            u = seen(h @ w(f"layers.{i}.w_up").T, f"{at} w_up")
            act = seen(g / (1.0 + np.exp(-g)) * u, f"{at} swiglu")
            x = seen(x + act @ w(f"layers.{i}.w_down").T, f"{at} w_down (residual)")
        seen(norm(x, w("final_norm"), "final_norm") @ w("lm_head").T, "lm_head (logits)")
