"""decode-lab kernels: numba.cuda kernels, each beside its NumPy twin, registered in REGISTRY.

Importing this package compiles nothing and needs no GPU. The import block is the table of
contents: one line per file, with the kernels it defines.
"""
from kernels.registry import REGISTRY, KernelSpec  # the registry and its entry type
from kernels import reduce      # (device fns only) warp_sum, warp_sums, block_sum, block_argmax: the shared reduction orders
from kernels import embed       # embed
from kernels import rmsnorm     # rmsnorm (+ bug variant rmsnorm_late_wait)
from kernels import matvec      # matvec, matvec_residual (+ device fns row_dot, row_dot_loaded, row_dot2, row_load, load_group)
from kernels import rope        # rope_kv_append (+ bug variant rope_kv_append_row)
from kernels import attention   # attn_partial, attn_merge, attn_combine (+ device fns partial_slice, merge_weights, merge_elem_sh, merge_elem; bug variant attn_partial_len)
from kernels import mlp         # swiglu_up
from kernels import sample      # argmax_next; argmax_next_float (a deliberate bug's sampler)
from kernels import position    # advance
from kernels import draft       # draft_lookup, draft_ngram, accept (speculative decoding: drafts, greedy acceptance)
from kernels import verify_attention  # verify_partial, verify_merge: the verify step's split-K attention over the cache + the causal block (+ device fns lane_sums16, lane_sums32: the column reduce-scatters)
from kernels import verify      # embed_cols, rmsnorm_cols, matmat, matmat_residual, swiglu_cols, rope_kv_append_cols, argmax_cols: the model over T columns (+ device fns col_dots, col_dots2, matmat_rows)
from kernels import fused_device  # (device fns only) xw_dot2, xw_dot, inv_rms (the norm folded into a row), head_dots, heads_dots, slice_partial
from kernels import sync        # (device fns only) release_add, acquire_load, acq_rel_add, count_arrival, wait_arrivals, arrive_last, ll_store, ll_load: blocks handing data over through global memory
from kernels import fused       # norm_qkv_rope, attn_fused, norm_swiglu, norm_lm_head_argmax (LAB_FUSION=1)
from kernels import fused_split  # attn_partial_wide, attn_project_heads (attn_fused split in launches: LAB_SPLIT_COMBINE=1 under fusion)
from kernels import persistent  # step_persistent: the whole fused step in one cooperative kernel (LAB_PERSISTENT=1)
from kernels import probe       # empty, spin, pos_set, relay (cost-recorder probes, not part of a step)
from kernels import loop        # loop_plan, loop_continue (CUDA C for conditional nodes; LAB_LOOP=device)

__all__ = ["REGISTRY", "KernelSpec", "reduce", "embed", "rmsnorm", "matvec", "rope", "attention", "mlp",
           "sample", "position", "draft", "verify_attention", "verify", "fused_device", "sync", "fused", "fused_split", "persistent", "probe", "loop"]
