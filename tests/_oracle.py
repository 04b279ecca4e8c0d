"""Holding an engine's logits against the float64 oracle (lab/reference.py): the tolerance and
the stepping, shared by tests/engine/test_engine.py and tests/engine/test_fusion.py; and causal attention of
a verify step's queries."""
import numpy as np


def logit_tol(ref):
    """float32 kernels vs the float64 oracle: each logit is a chain of 4 layers of float32 dot
    products of length <= 512 (relative rounding ~sqrt(512) * eps per dot, compounded through the
    residual stream). 2048 * eps(float32) * |logit| (~2.4e-4 relative) plus 1e-4 absolute for
    logits near zero is ~10x above the largest error measured on this model, yet far below the
    gap between a top-1 and a top-2 logit that would flip a token. The fused kernels reorder
    sums (attention's partials by thread groups) but keep every sum in float32 with the same
    lengths, so the same bound holds for them."""
    return 1e-4 + 2048 * np.finfo(np.float32).eps * np.abs(ref)


def stepped_logits(eng, ref_tokens, n_prompt: int, n_tokens: int) -> np.ndarray:
    """Reset `eng` with the prompt ref_tokens[:n_prompt], step through prompt and n_tokens
    generated positions, and return the logits of every generating step ([n_tokens, V],
    float64)."""
    eng.reset(ref_tokens[:n_prompt], n_tokens)
    got = []
    for pos in range(n_prompt - 1 + n_tokens):
        eng.step()
        if pos + 1 >= n_prompt:
            got.append(eng.logits())
    return np.array(got, dtype=np.float64)
