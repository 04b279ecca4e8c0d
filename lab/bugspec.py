"""The deliberate bugs as data: what each one freezes or breaks, how it is caught, its fix, and
the pieces of the step (lab/engine/step.py) it overrides -- and the refusals that follow from those
pieces. Light on purpose (no numba, no step, no backend): `lab.config` validates a toggle set
with it, so `import lab.config` stays cheap. The overrides themselves live in lab/engine/bugs.py.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bug:
    name: str
    kind: str          # "frozen", "illegal", "race", "fault", "unreplayed" or "rank"
    what: str          # what a capture freezes, or which illegal operation fires
    caught_by: str     # "audit", "lazy-init detector", "PDL check", "ledger, replay gate and
                       # audit's key check" or "collective order check"
    fix: str
    overrides: tuple[str, ...] = ()   # the step's pieces its override replaces (lab/engine/bugs.py)

    @property
    def env(self) -> str:
        return f"LAB_BUG_{self.name.upper()}"


BUGS: dict[str, Bug] = {b.name: b for b in (
    Bug("frozen_kv_row", "frozen", "pointer: the KV-cache row k_cache[pos] (buffer + offset)", "audit",
        "pass the whole cache; the kernel indexes the row with the device-resident position",
        ("append_kv",)),
    Bug("ctx_by_value", "frozen", "loop bound: the context length passed by value", "audit",
        "read the context length from device memory (pos[0] + 1) inside the kernel",
        ("attention",)),
    Bug("pos_outside_graph", "frozen", "the position, uploaded by the host before the step", "audit",
        "advance the position with a kernel inside the captured step, or write the device "
        "position before every graph launch, not only before the capture",
        ("prelude", "advance")),
    Bug("lazy_table", "illegal", "table upload on first use (synchronous host-to-device copy)",
        "lazy-init detector", "upload every table at start-up, before any capture",
        ("prepare_rope",)),
    Bug("lazy_scratch", "illegal",
        "scratch allocation through the synchronous allocator when the capacity is short",
        "lazy-init detector", "allocate scratch for the largest plan once, at start-up",
        ("prepare_attention", "scratch")),
    Bug("raw_array", "illegal", "array-interface synchronisation of a raw CuPy argument",
        "lazy-init detector", "wrap each buffer once with cuda.as_cuda_array(x, sync=False)",
        ("norm_input",)),
    Bug("late_wait", "race", "a read of the predecessor's output before the PDL wait",
        "PDL check", "make pdl_wait() the first statement of every kernel",
        ("attn_norm_kernel",)),
    Bug("float_ids", "fault",
        "a buffer passed with the wrong dtype: the sampler gets the int32 token buffer viewed as "
        "float32 and stores id 40 as 40.0f, whose bits the next step's embedding reads as an "
        "id near 1.1e9, far outside its table; the fault is reported by a later call",
        "LAB_LAUNCH_BLOCKING=1 and the launch log",
        "pass every buffer with the dtype it was allocated with (the token ids as int32)",
        ("sample_next",)),
    Bug("step_key", "unreplayed",
        "the graph cache's key: the plan key and the engine's step count, a value that changes "
        "every step and never repeats, so every step captures a graph (successfully) and none "
        "is ever replayed",
        "ledger, replay gate and audit's key check",
        "key the graph cache on what changes the captured work (the plan key) and nothing else; "
        "a value that changes every step belongs in device memory, read by the kernels",
        ("graph_key",)),
)}

# Bugs of the tensor-parallel step (LAB_RANKS=2, lab/engine/ranks.py): an override of the rank step,
# not of the one-GPU step, so they live apart from BUGS (whose rows every one-GPU notebook walks).
RANK_BUGS: dict[str, Bug] = {b.name: b for b in (
    Bug("rank_skew", "rank",
        "each rank's own plan decision: rank 1 picks the all-reduce algorithm from ITS measured "
        "message cost and, from the 4-split plans on (context 64+), issues reduce-scatter + "
        "all-gather where rank 0 issues all-reduce",
        "collective order check",
        "make every decision that changes a rank's collectives from state every rank shares "
        "(the position, the plan key), never from one rank's own measurements",
        ("all_reduce",)),
)}

# Bugs of the speculative step (LAB_DRAFT>0, lab/engine/draft.py): an override of the verify step,
# so, like the rank bugs, apart from BUGS.
SPEC_BUGS: dict[str, Bug] = {b.name: b for b in (
    Bug("spec_key", "unreplayed",
        "the verify graph's key: the plan key and the position the last step reached, read back "
        "from the device after every step (a host sync the clean step never makes); drafting "
        "moves the position by the accepted count, so a decode meets a new key at every step "
        "and captures a graph for it (successfully); timed reps that revisit the warm-up's "
        "positions replay those graphs, 100% replays no real decode would see",
        "ledger, replay gate and audit's key check",
        "key the verify graph on what changes the captured work (the plan key and the draft "
        "length) and nothing else; the accepted count and the position stay in device memory, "
        "read by the kernels, and the host reads them once, at the end",
        ("graph_key",)),
)}

# The one-op-per-kernel step's pieces the fused step (LAB_FUSION=1, `FusedStep.absent`) does not
# have, and where their work went.
FUSED_ABSENT: dict[str, str] = {
    "attn_norm_kernel": "the standalone attention rmsnorm, which norm_qkv_rope folds in",
    "append_kv": "the standalone RoPE + KV append, which is norm_qkv_rope's epilogue",
    "attention": "the standalone attention partial, which the fused attention (attn_fused_grid, "
                 "or attn_fused with LAB_ATTN_TAIL=heads) does together with the merge, the "
                 "output projection and the residual add (under LAB_SPLIT_COMBINE=1 its first "
                 "phase is a launch of its own: attn_partial, or attn_partial_wide)",
    "advance": "the standalone position kernel: norm_lm_head_argmax advances the position",
    "sample_next": "the standalone argmax: norm_lm_head_argmax picks the next id",
}


def refusals(names, absent: dict[str, str]) -> dict[str, str]:
    """{bug: why it cannot exist} for the named one-GPU bugs that override a piece of the step
    listed in `absent` (a step variant's missing pieces, e.g. FUSED_ABSENT)."""
    chosen = set(names)
    out = {}
    for name in (n for n in BUGS if n in chosen):
        missing = [piece for piece in BUGS[name].overrides if piece in absent]
        if missing:
            out[name] = "; ".join(f"it overrides `{piece}`, {absent[piece]}" for piece in missing)
    return out


def fusion_refusal(names) -> str | None:
    """Why the named bugs cannot run with LAB_FUSION=1 (None: they can), for LabConfig."""
    why = refusals(names, FUSED_ABSENT)
    if not why:
        return None
    return " ".join(f"{BUGS[n].env}=1 cannot exist in the fused step (LAB_FUSION=1): {reason}."
                    for n, reason in why.items()) + " Run it with LAB_FUSION=0."


def loop_refusal(cfg) -> str | None:
    """Why `cfg`'s bugs cannot run with its LAB_LOOP (None: they can), for LabConfig: a bug of
    the host loop's graph cache has nothing to act on in the device loop's one graph."""
    if "step_key" in cfg.bugs and cfg.loop == "device":
        return ("LAB_BUG_STEP_KEY=1 keys the host loop's graph cache; LAB_LOOP=device runs one "
                "loop graph with no cache to key. Run it with LAB_LOOP=host")
    return None


def _refused(toggles, bugs, allowed_bugs, why_bugs: str) -> list[tuple[str, str]]:
    """(variable, why) for each (variable, on, why) of `toggles` that is on, and one entry for
    the switched-on bugs not in `allowed_bugs`."""
    off = [(var, why) for var, on, why in toggles if on]
    other = sorted(set(bugs) - set(allowed_bugs))
    if other:
        off.append((", ".join(f"LAB_BUG_{b.upper()}=1" for b in other), why_bugs))
    return off


DRAFT_SPLITS_DEFAULT = 16       # LAB_DRAFT_SPLITS's default (lab/config.py TOGGLES)
VERIFY_MAX_COLS = 9             # kernels/draft.py MAX_COLS (this module loads no numba; a test
                                # holds the two equal): the columns a verify step's kernels take


def draft_refusal(cfg) -> str | None:
    """Why `cfg` cannot run as configured with respect to LAB_DRAFT (None: it can), for
    LabConfig: the verify step is the unfused step over draft + 1 positions, on one device."""
    if "spec_key" in cfg.bugs and cfg.draft == 0:
        return ("LAB_BUG_SPEC_KEY=1 keys the verify graph of speculative decoding: it needs "
                "LAB_DRAFT=2, 4 or 8")
    splits = getattr(cfg, "draft_splits", DRAFT_SPLITS_DEFAULT)
    if cfg.draft == 0 and splits != DRAFT_SPLITS_DEFAULT:
        return (f"LAB_DRAFT_SPLITS={cfg.draft_splits} sets the verify attention's split count: it "
                f"needs LAB_DRAFT=2, 4 or 8 (one token per step runs no verify attention), as "
                f"LAB_ATTN_TAIL=heads needs LAB_FUSION=1")
    if cfg.draft == 0 and getattr(cfg, "drafter", "lookup") != "lookup":
        return (f"LAB_DRAFTER={cfg.drafter} chooses speculative decoding's drafter: it needs "
                f"LAB_DRAFT=2, 4 or 8 (one token per step drafts nothing)")
    if cfg.draft == 0:
        return None
    if cfg.draft + 1 > VERIFY_MAX_COLS:
        return (f"LAB_DRAFT={cfg.draft} would verify {cfg.draft + 1} columns a step: the verify "
                f"kernels take at most MAX_COLS = {VERIFY_MAX_COLS} (kernels/draft.py: every lane "
                f"of matmat holds one fma chain and a pass of loads per column in registers, "
                f"MAX_COLS of them); use LAB_DRAFT=2, 4 or 8")
    off = _refused((
        ("LAB_FUSION=1", cfg.fusion, "the verify step is the unfused step over draft + 1 positions"),
        ("LAB_SPLIT_COMBINE=1", cfg.split_combine, "the verify step has its own merge and projection"),
        ("LAB_OVERLAP=1", cfg.overlap, "the verify step's projections run on one stream"),
        ("LAB_RANKS=2", cfg.ranks > 1, "the verify step runs on one device"),
        ("LAB_LOOP=device", cfg.loop == "device", "the device loop's bodies are one-token steps"),
        ("LAB_PLAN_SWITCH=update", cfg.plan_switch == "update",
         "the verify step has one plan, so nothing to switch"),
    ), cfg.bugs, SPEC_BUGS, "they override pieces of the one-token step")
    if not off:
        return None
    return (f"LAB_DRAFT={cfg.draft} runs the speculative verify step (one device, graphs or eager, "
            f"PDL allowed) and nothing else yet: " + "; ".join(f"{v} cannot combine with it ({w})"
                                                             for v, w in off)
            + ". Run those with LAB_DRAFT=0")


# The pieces of the step the persistent step (LAB_PERSISTENT=1, lab/engine/persistent.py) does not
# have: it is the fused step's math in one kernel, so it lacks what the fused step lacks, and the
# pieces it keeps only as host work (prelude, prepare_rope, prepare_attention, scratch, graph_key).
PERSISTENT_ABSENT: dict[str, str] = {
    **FUSED_ABSENT,
    "norm_input": "the attention norm's input as an argument: step_persistent reads x (the "
                  "embedding row in layer 0) inside its one launch",
}


def persistent_refusal(cfg) -> str | None:
    """Why `cfg` cannot run with LAB_PERSISTENT=1 (None: it can), for LabConfig: one kernel
    per token on one device, with graphs or eagerly, and nothing else."""
    if not getattr(cfg, "persistent", False):
        return None
    off = [(var, why) for var, on, why in (
        ("LAB_FUSION=1", cfg.fusion, "the persistent step is the fused step's math already: "
                                     "leave LAB_FUSION=0"),
        ("LAB_SPLIT_COMBINE=1", cfg.split_combine, "one kernel has no launches to split into"),
        ("LAB_OVERLAP=1", cfg.overlap, "one kernel on one stream: no side stream to fork"),
        ("LAB_PDL=1", cfg.pdl, "one kernel per step has no node boundary for a dependent "
                               "launch to overlap"),
        ("LAB_RANKS=2", cfg.ranks > 1, "a cooperative grid runs on one device"),
        ("LAB_DRAFT>0", cfg.draft > 0, "the verify step is the unfused step over draft + 1 "
                                       "positions"),
        ("LAB_LOOP=device", cfg.loop == "device", "conditional-node bodies are not built for "
                                                  "cooperative kernels here"),
        ("LAB_PLAN_SWITCH=update", cfg.plan_switch == "update",
         "not built for the cooperative kernel's node"),
    ) if on]
    why = refusals(cfg.bugs, PERSISTENT_ABSENT)
    off += [(f"{BUGS[n].env}=1", f"{reason}") for n, reason in why.items()]
    if not off:
        return None
    return ("LAB_PERSISTENT=1 runs the whole step in one cooperative kernel (one device, graphs "
            "or eager) and nothing else: " + "; ".join(f"{v} cannot combine with it ({w})"
                                                     for v, w in off)
            + ". Run those with LAB_PERSISTENT=0")


def tail_refusal(cfg) -> str | None:
    """Why `cfg`'s LAB_ATTN_TAIL cannot apply (None: it can), for LabConfig: it chooses the
    fused attention's tail, so `heads` needs the fused step (the persistent step runs the grid
    form whatever it says)."""
    if getattr(cfg, "attn_tail", "grid") == "heads" and not (cfg.fusion or cfg.persistent):
        return ("LAB_ATTN_TAIL=heads chooses the fused attention's tail: it needs LAB_FUSION=1 "
                "(the one-op-per-kernel step's attention is attn_partial + attn_combine)")
    return None


def ranks_refusal(cfg) -> str | None:
    """Why `cfg` cannot run as configured with respect to ranks (None: it can), for LabConfig."""
    if "rank_skew" in cfg.bugs and cfg.ranks < 2:
        return ("LAB_BUG_RANK_SKEW=1 is a disagreement between ranks: it needs LAB_RANKS=2")
    if cfg.ranks < 2:
        return None
    off = _refused((
        ("LAB_FUSION=1", cfg.fusion, "the fused kernels take whole heads and the whole residual"),
        ("LAB_PDL=1", cfg.pdl, "a collective is no programmatic launch"),
        ("LAB_OVERLAP=1", cfg.overlap, "the side stream is not part of the rank's step"),
        ("LAB_LOOP=device", cfg.loop == "device", "the loop graph is one device's"),
        ("LAB_PLAN_SWITCH=update", cfg.plan_switch == "update", "each rank's graph is its own"),
    ), cfg.bugs, RANK_BUGS, "the one-GPU bugs override pieces of the one-GPU step")
    if not off:
        return None
    return (f"LAB_RANKS={cfg.ranks} runs the one-op-per-kernel step with graphs or eagerly, and "
            f"nothing else yet: " + "; ".join(f"{v} is not built for ranks ({w})" for v, w in off)
            + ". Run those with LAB_RANKS=1")
