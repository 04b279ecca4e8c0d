"""The megakernel rung (LAB_PERSISTENT=1): the whole decode step of one token in ONE persistent,
cooperative kernel, its phases handing data to each other through counters in global memory
instead of grid barriers.

Contents
  geometry        PERSISTENT_THREADS, persistent_geometry, counter_slots, waits_per_token,
                  barriers_per_token (0), phase_count
  the protocol    the counter slots (SLOT_*), the body's VARIANTS (preload, lean, spin,
                  merge1, wo_pre, wpick, tails; epoch or arrive exit) and DEFAULT_VARIANT;
                  PROBES (bodies that leave work out: timing only, no twin; noproj);
                  launch_adds / wrap32 / settled (the counts a clean launch leaves), wait_code /
                  describe_wait (the error word), the items a block does (mine),
                  block_program: the kernel's items, waits, bumps and (tails) arrivals as a
                  Python generator (tests/kernels/test_megakernel_protocol.py runs it under
                  adversarial block orders)
  device pieces   record_give_up (the error word keeps the smallest wait code), wait_count /
                  wait_count_spin (a bounded spin over an int32 difference by kernels/sync.py's
                  acquire loads, with or without a backoff), bump (a release add), block_pick /
                  warp_pick (the argmax of a 128-thread block; by one warp), clock64 /
                  globaltimer; the elections (the tails merge, the arrive exit) are
                  kernels/sync.py's arrive_last
  twin            step_persistent_twin: the fused step's twins (LAB_ATTN_TAIL=grid), composed,
                  then the counter as a clean launch leaves it (_make_twin: per exit form)
  the kernel      _make_body (stamped, then a variant's choices); step_persistent
                  (DEFAULT_VARIANT);
                  step_persistent_stamped, the same body with a clock stamp per phase
                  (STAMP_FIELDS); variant_kernel / variant_spec: the other variants and
                  the probes. Only step_persistent is registered: kernels/check.py,
                  scripts/megakernel_probe.py and the megakernel_bound experiment compile
                  the others
  CASES           kernels/check.py's cases

Every phase calls the fused step's device functions (kernels/fused_device.py's folded-norm dots,
kernels/attention.py's partial_slice_at and merge, kernels/matvec.py's row dots) in their order,
so the kernel writes the bits of LAB_FUSION=1 with LAB_ATTN_TAIL=grid (attn_fused_grid: the
unfused attention's partials and combine), on the simulator and on a GPU, in every variant.
Every body calls the plain dots after each wait but the preload ones: kernels/matvec.py's
`row_load` records that matvec built on the preloading forms (`row_load` / `row_dot_loaded`:
local arrays passed across device functions) measured 1.1 to 2.4 us slower per node on the
H200; the preload variants keep that form for scripts/megakernel_probe.py to time against it.
"""
import math
import time

import numba
import numpy as np
from numba import config, cuda

from kernels.registry import KernelSpec, kernel
from kernels.attention import (ATTN_STEPS, ATTN_THREADS, ATTN_WARPS, MAX_D, MERGE_MAX_PAIRS,
                               merge_elem_batch, merge_elem_sh, merge_weights,
                               partial_slice_at, udivmod)
from kernels.embed import embed_twin
from kernels.fused import (MAX_HEAD_DIM, attn_fused_grid_twin, norm_lm_head_argmax_twin,
                           norm_qkv_rope_twin, norm_swiglu_twin)
from kernels.fused_device import (XW_UNROLL, inv_rms, xw_dot, xw_dot2, xw_dot2_loaded,
                                  xw_dot_loaded, xw_load, xw_load1)
from kernels.matvec import ROW_UNROLL, matvec_residual_twin, row_dot, row_dot_loaded, row_load
from kernels.pdl import pdl_wait
from kernels.reduce import SHUFFLES, WARP, better
from kernels.sync import acquire_load, arrive_last, backoff, release_add

__all__ = ["step_persistent", "persistent_geometry", "counter_slots", "SIM_GRID",
           "block_program", "describe_wait"]

SIM_GRID = 132            # the simulator's grid: the H200's SM count (it has no occupancy API)
PERSISTENT_THREADS = ATTN_THREADS   # 128: attn_partial's block (partial_slice_at's 4 warps)
PERSISTENT_WARPS = PERSISTENT_THREADS // WARP
# polls before a wait gives up (on a GPU each poll is an acquire load and a backoff's nanosleep;
# a phase's producers count long before); numba's simulator runs blocks one after another, so a
# wait not met at once never is there
SPIN_LIMIT = 64 if config.ENABLE_CUDASIM else 1 << 21
GIVE_UP_EVERY = 1024 if not config.ENABLE_CUDASIM else 16  # polls between looks at the error
                          # word: once one wait gave up, the others stop within this many

# ---- the protocol ------------------------------------------------------------------------------
# counter slots (int32): the error word, the exit's slots, then one count per dependency. A count
# is cumulative over the layers of one launch (its target at layer l is (l + 1) times what one
# layer adds). Two ways to leave them for the next launch (a compile-time choice, `VARIANTS`):
#   epoch   nothing is reset: every block reads the launch count E (SLOT_EPOCH) at
#           its start and waits for E * launch_adds(slot) + its target, compared as an int32
#           difference (wraparound-safe); one block (the grid's last) waits for every logit,
#           picks the token, advances pos and E. No other block waits at the exit.
#   arrive  (the default's) every block arrives at SLOT_EXIT (arrive_last); the last picks the
#           token, advances pos and sets every count back to 0.
# Either way a captured graph replays step after step with no host reset.
SLOT_ERR = 0       # 0, or the smallest wait_code of the waits that gave up (record_give_up)
SLOT_EXIT = 1      # arrive: blocks past their last phase (arrive_last: the last picks the token)
SLOT_EPOCH = 2     # epoch: launches completed (E; the picker adds 1)
SLOT_LOGITS = 3    # epoch: logits the LM head has written (V per launch)
SLOT_X_DOWN = 4    # rows of x the down projection has written (D per layer)
SLOT_X_ATTN = 5    # rows of x the attention output projection has written (D per layer)
SLOT_ACT = 6       # rows of act the MLP's up projection has written (F per layer)
SLOT_PART = 7      # attention items (head, slice) written (n_head * splits per layer)
SLOT_QKV = 8       # + h: rotate-half pairs of head h's q, k and v written (3 hd / 2 per layer;
                   # the tails variants count head h's slices there too, splits per layer:
                   # the slice that completes a layer's count merges the head)

# the body's compile-time choices, each against plain/arrive, the body with none of them
# (kernels/check.py holds every variant to the default's bits; scripts/megakernel_probe.py
# times them side by side)
#   preload  each warp phase loads its first group of weights before its wait (the `_loaded`
#            dots); else it calls the plain dots (row_dot, xw_dot2, xw_dot) after the wait: the
#            same fmas in the same order
#   epochs   the exit: epoch (True) or arrive (False), above
#   lean     the qkv phase's index arithmetic by unsigned divisions (udivmod) where the
#            plain body divides int64 with sign fix-ups, and its rotary factors (cos, sin) loaded
#            before its wait, where the plain body loads them after the dot's reduction: the same
#            values, the same bits
#   spin     a wait polls its count back to back (`wait_count_spin`), where the plain body backs
#            off 64 ns between polls (`backoff`): a count that lands just after a poll is seen
#            one round trip sooner, not a sleep plus a round trip
#   merge1   the output projection's merge by `merge_elem_batch`: each element's m, l and o
#            loaded in one round, where the plain body's merge_weights loads the (m, l) pairs,
#            meets twice, and only then do the elements' loads start (the same operations in
#            the same order: the same bits)
#   wo_pre   the output projection alone loads its row of Wo before its wait (the preload
#            form, for the one phase whose wait is long: it waits for the attention)
#   tails    each head merged once, by the block whose slice completes the head's count
#            (`arrive_last` on the head's qkv slot, not reset, which then counts 3 hd / 2 pairs and
#            `splits` slices a layer), into act[h*hd:(h+1)*hd] (act is free from the layer
#            before's down projection to this layer's mlp up, which overwrites it); the output
#            projection waits for the heads' merged outputs (n_head a layer on the partials'
#            count) and dots its rows with act, where the plain body waits for every partial and
#            merges all of o in every block: at context 900, 128 partials, that merge was most
#            of the step's growth. merge_weights + merge_elem_sh on the head's slices: the same
#            bits. The arrive exit only; where d_ff < d_model, the plain body's merge
#   wpick    the exit's argmax by warp 0 alone with shuffles (`warp_pick`), where the plain body
#            runs a tree over the block with a barrier per level (`block_pick`); the argmax is
#            exact, so any pairing picks the same id (numba's simulator, which has no
#            shuffles, runs block_pick)
_PLAIN = dict(preload=False, epochs=False, lean=False, spin=False, merge1=False, wo_pre=False,
              wpick=False, tails=False, noproj=False)
VARIANTS = {"plain/epoch": {**_PLAIN, "epochs": True},
            "plain/arrive": dict(_PLAIN),
            "preload/arrive": {**_PLAIN, "preload": True},
            "lean/arrive": {**_PLAIN, "lean": True},
            "lean+spin/arrive": {**_PLAIN, "lean": True, "spin": True, "wpick": True},
            "lean+merge/arrive": {**_PLAIN, "lean": True, "merge1": True, "wpick": True},
            "quick/arrive": {**_PLAIN, "lean": True, "spin": True, "merge1": True,
                             "wpick": True},
            "quick+wo/arrive": {**_PLAIN, "lean": True, "spin": True, "merge1": True,
                                "wpick": True, "wo_pre": True},
            "tails/arrive": {**_PLAIN, "lean": True, "spin": True, "wpick": True,
                             "tails": True}}
# Bodies that leave work out, to bound what a restructured body could gain: timing only, their
# bits are NOT the step's (kernels.check and the protocol tests run VARIANTS, not these).
#   noproj   the output projection phase left out: mlp up waits for the heads' merged outputs
#            (as the output projection does) and reads the layer's input x, down adds to it. A
#            body that folded the projection into the attention's tail (each merging block
#            projecting its head) would have this body's waits plus that work: its time is a
#            lower bound for such a body. On the H200 it is 1.05 / 1.12 times the best
#            multi-node arm at contexts 64 / 900 (data/gpu/megakernel_bound.json): such a fold
#            cannot put the megakernel ahead
PROBES = {"tails-noproj/arrive": {**VARIANTS["tails/arrive"], "noproj": True}}
# The default, tails/arrive: the fastest body at context 900 and within 3 us a token of the
# fastest at 64, ahead of plain/arrive at both (scripts/megakernel_probe.py on the H200, graph
# replay, interleaved; data/gpu/megakernel_probe.txt's fifth printout, whose "+ar" bodies had
# the one-atomic election kernels/sync.py's arrive_last has since: tails 0.0653 / 0.0798
# ms/token at contexts 64 / 900, lean+spin 0.0635 / 0.0856; plain/arrive, the default until
# then, 1.25 / 1.35 times the best multi-node arm where tails is 1.20 / 1.24).
# What the choices did there and in the probe's earlier printouts (data/gpu/persistent.json
# times every variant side by side; notebook 10 prints each choice's effect alone):
#   preload  slower: 0.0783-0.0802 against plain's 0.0686-0.0687 ms/token at context 64
#   epochs   the same speed as the arrive exit (0.0686 against 0.0687); the arrive exit's counts
#            end at 0, which a reader of the counter checks at a glance
#   lean     its qkv phase's work 2.42 against 3.07 us a layer by the stamped forms
#   spin     pays at both contexts
#   merge1   pays at context 900 (32 slices a head), costs at 64 (the output projection's work
#            3.5 -> 5.7 us a layer)
#   tails    at context 900 the output projection's step fell from 8.96 to 2.14 us a layer and
#            the attention's grew from 3.20 to 9.28 (its tail merges the head's 32 slices in
#            four rounds of loads): a wait moved, not removed, for a net gain
# kernels.check holds every variant to the default's bits, and the default to its timeout case.
DEFAULT_VARIANT = "tails/arrive"   # step_persistent's body

PHASES = ("qkv", "attention", "out proj", "mlp up", "down")   # a layer's phases, in order
PHASE_LM = len(PHASES)                                         # then the LM head, then the exit
PHASE_PICK = PHASE_LM + 1                                      # (the epoch exit's one wait)
WAIT_WHAT = ("qkv waits for x: every down-projection row of the layer before",
             "attention waits for head {h}'s q, k and v rows",
             "the output projection waits for every attention partial (the tails variants: "
             "every head's merged output)",
             "mlp up waits for x: every output-projection row",
             "down waits for act: every mlp row",
             "the LM head waits for x: every down-projection row of the last layer",
             "the token pick waits for every logit")
CODE_HEADS = 1024  # wait_code's room for a head index


def counter_slots(n_head: int) -> int:
    """The kernel's int32 counter slots: the error word, the exit's three, four counts, one per
    head (every variant's layout)."""
    return SLOT_QKV + n_head


def launch_adds(n_layer, D, F, V, n_head, head_dim) -> np.ndarray:
    """What one clean launch of the epoch form adds to each slot (int64 [counter_slots]): after
    E launches from zeros the counter reads E * this (int32 wraparound), whatever plans (split
    counts) they ran: the picker tops the partials' count up from n_layer * n_head * splits to
    n_layer * MERGE_MAX_PAIRS. The arrive form adds nothing net (its counts end at 0)."""
    adds = np.zeros(counter_slots(n_head), np.int64)
    adds[SLOT_EPOCH] = 1
    adds[SLOT_LOGITS] = V
    adds[SLOT_X_DOWN] = adds[SLOT_X_ATTN] = n_layer * D
    adds[SLOT_ACT] = n_layer * F
    adds[SLOT_PART] = n_layer * MERGE_MAX_PAIRS
    adds[SLOT_QKV:] = n_layer * 3 * (head_dim // 2)
    return adds


def wrap32(v):
    """v as an int32 wraps it (two's complement): the counts' arithmetic."""
    return ((v + 2147483648) % 4294967296) - 2147483648


_wrap32 = cuda.jit(device=True)(wrap32)


def settled(counter, adds) -> bool:
    """Is `counter` (int [counter_slots]) what clean launches leave: the exit election at 0 and
    every count E * adds (E = its epoch slot; 0 for the arrive form, whose counts are 0)?"""
    c = np.asarray(counter, np.int64)
    want = np.array([wrap32(int(c[SLOT_EPOCH]) * int(a)) for a in adds], np.int64)
    return c[SLOT_EXIT] == 0 and np.array_equal(c[SLOT_LOGITS:], want[SLOT_LOGITS:])


def wait_code(layer, kind, head):
    """The error word a wait writes when it gives up: nonzero, naming the wait."""
    return 1 + (layer * (PHASE_PICK + 1) + kind) * CODE_HEADS + head


_wait_code = cuda.jit(device=True)(wait_code)


def describe_wait(code: int) -> str:
    """The wait an error word names, in words ('' for 0)."""
    if code <= 0:
        return ""
    layer, rest = divmod(code - 1, (PHASE_PICK + 1) * CODE_HEADS)
    kind, head = divmod(rest, CODE_HEADS)
    what = WAIT_WHAT[kind].format(h=head) if kind < len(WAIT_WHAT) else f"wait kind {kind}"
    return what if kind >= PHASE_LM else f"layer {layer}: {what}"


def mine(n, blk, G):
    """How many of n items block blk does when items go round-robin over G blocks (item i to
    block i % G): every phase's assignment, which spreads each phase over every SM."""
    return (n - blk + G - 1) // G if blk < n else 0


_mine = cuda.jit(device=True)(mine)


def waits_per_token(n_layer: int, epochs: bool | None = None) -> int:
    """Counts waited on per token: the qkv of every layer but the first (x), attention, output
    projection, mlp up and down of every layer, the LM head (each one count's wait, in the
    blocks that have items in it), and with the epoch exit the token pick's wait for every
    logit (one block). No grid barrier. epochs None: the default variant's exit."""
    if epochs is None:
        epochs = VARIANTS[DEFAULT_VARIANT]["epochs"]
    return 5 * n_layer + (1 if epochs else 0)


def barriers_per_token(n_layer: int) -> int:
    """Grid barriers in one token's step: none (each phase waits on a count: waits_per_token)."""
    return 0


def phase_count(n_layer: int) -> int:
    """Phases a token's step stamps (step_persistent_stamped): five per layer, the LM head, the
    exit."""
    return len(PHASES) * n_layer + 2


def persistent_geometry(head_dim: int, sms: int, co_resident: int, threads: int | None = None):
    """(grid, block) for `step_persistent`: blocks of PERSISTENT_THREADS threads (`threads`
    must say the same: attn_partial's walk is 4 warps), as many blocks as SMs, capped by the
    blocks the device can hold at once (`co_resident`, a cooperative launch's limit: every wait
    needs its producers resident). ValueError with the reason where the block cannot run the
    kernel or no block fits."""
    t = PERSISTENT_THREADS if threads is None else threads
    if t != PERSISTENT_THREADS:
        raise ValueError(f"step_persistent needs a block of {PERSISTENT_THREADS} threads "
                         f"(attn_partial's 4 warps); got {t}")
    if not 2 <= head_dim <= MAX_HEAD_DIM or head_dim % 2:
        raise ValueError(f"head_dim {head_dim}: step_persistent needs an even head_dim <= "
                         f"{MAX_HEAD_DIM}")
    if co_resident < 1:
        raise ValueError(f"the device cannot hold one block of {t} threads of step_persistent "
                         f"at once (max_cooperative_grid_blocks = {co_resident})")
    return (min(sms, co_resident),), (t,)


def block_program(blk, G, n_layer, D, F, V, n_head, head_dim, splits, warps=PERSISTENT_WARPS,
                  epochs=VARIANTS[DEFAULT_VARIANT]["epochs"],
                  tails=VARIANTS[DEFAULT_VARIANT]["tails"]):
    """Block blk's program in a grid of G blocks, as step_persistent runs it, one operation at a
    time: ("wait", slot, target, code) -- the target relative to the launch: the kernel adds
    E * launch_adds(slot) in the epoch form --, ("item", phase, layer, i) -- the item's writes
    done, in that order within the block --, ("bump", slot, n), and last ("pick",) in the
    epoch form's picker (block G - 1: the token, pos and E advanced) or ("exit",) in every
    block of the arrive form (arrive_last; the last picks and resets); the picker first tops
    the partials' count up to a launch's whole (launch_adds). The kernel's loops in
    Python: warp phases give warp w of round b the item b * G * warps + w * G + blk, the
    attention gives the block items blk, blk + G, ...; a warp phase waits once, before its first
    item (with preload, its weights are loaded before the wait), the attention before each
    item. The body's preload choice changes no operation here. tails (the arrive exit only):
    after each attention item, ("arrive", slot, whole, ("merge", layer, h)) -- the block adds 1
    to the head's qkv slot; the one whose add makes it `whole` merges head h, then bumps the
    partials' count by 1 --, the attention's waits grown by the layer's earlier slices, the
    output projection waiting for n_head merged heads."""
    if tails and epochs:
        raise ValueError("the tails body has the arrive exit")
    half = head_dim // 2
    n_pairs = 3 * (D // 2)
    n_items = n_head * splits
    GW = G * warps

    def warp_phase(n, phase, layer, slot, target, code):
        if blk >= n:
            return
        for base in range(0, n, GW):
            if base == 0 and target > 0:
                yield ("wait", slot, target, code)
            for w in range(warps):
                i = base + w * G + blk
                if i < n:
                    yield ("item", phase, layer, i)

    for layer in range(n_layer):
        yield from warp_phase(n_pairs, 0, layer, SLOT_X_DOWN, layer * D, wait_code(layer, 0, 0))
        for h in range(n_head):   # per-head bumps, each after the block's pairs
            c = sum(1 for i in range(blk, n_pairs, G) if (i % (D // 2)) // half == h)
            if c:
                yield ("bump", SLOT_QKV + h, c)
        for item in range(blk, n_items, G):
            h = item // splits
            yield ("wait", SLOT_QKV + h, (layer + 1) * 3 * half + (layer * splits if tails else 0),
                   wait_code(layer, 1, h))
            yield ("item", 1, layer, item)
            if tails:
                yield ("arrive", SLOT_QKV + h, (layer + 1) * (3 * half + splits),
                       ("merge", layer, h))
        if mine(n_items, blk, G) and not tails:
            yield ("bump", SLOT_PART, mine(n_items, blk, G))
        for phase, n, slot, target, out in (
                (2, D, SLOT_PART, (layer + 1) * (n_head if tails else n_items), SLOT_X_ATTN),
                (3, F, SLOT_X_ATTN, (layer + 1) * D, SLOT_ACT),
                (4, D, SLOT_ACT, (layer + 1) * F, SLOT_X_DOWN)):
            yield from warp_phase(n, phase, layer, slot, target, wait_code(layer, phase, 0))
            if mine(n, blk, G):
                yield ("bump", out, mine(n, blk, G))
    yield from warp_phase(V, PHASE_LM, n_layer, SLOT_X_DOWN, n_layer * D,
                          wait_code(n_layer, PHASE_LM, 0))
    if not epochs:
        yield ("exit",)
        return
    if mine(V, blk, G):
        yield ("bump", SLOT_LOGITS, mine(V, blk, G))
    if blk == G - 1:
        yield ("wait", SLOT_LOGITS, V, wait_code(n_layer, PHASE_PICK, 0))
        yield ("bump", SLOT_PART, n_layer * (MERGE_MAX_PAIRS - n_items))   # the plan-free top-up
        yield ("pick",)


# ---- device pieces -----------------------------------------------------------------------------
if config.ENABLE_CUDASIM:   # the simulator: clocks are the host's
    def clock64():
        return time.perf_counter_ns()

    def globaltimer():
        return time.perf_counter_ns()

    def require_cooperative():
        pass

else:
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    def _sreg64(name: str):
        @intrinsic
        def read(typingctx):
            def codegen(context, builder, sig, args):
                fnty = ir.FunctionType(ir.IntType(64), [])
                return builder.asm(fnty, f"mov.u64 $0, %{name};", "=l", [], side_effect=True)
            return types.int64(), codegen
        return read

    clock64 = _sreg64("clock64")          # this SM's cycle counter
    globaltimer = _sreg64("globaltimer")  # the device's nanosecond clock (all SMs)

    @intrinsic
    def require_cooperative(typingctx):
        """Nothing at run time; marks the kernel cooperative, as a grid sync would (numba then
        launches it with cudaLaunchCooperativeKernel): the launch fails rather than start a grid
        whose blocks are not all resident at once, which a spin wait needs."""
        def codegen(context, builder, sig, args):
            context.active_code_library.use_cooperative = True
            return context.get_dummy_value()
        return types.void(), codegen


@cuda.jit(device=True)
def record_give_up(counter, code):
    """counter[SLOT_ERR] = min(it, code), 0 counting as none (a CAS loop: one thread).

    Every wait that stops waiting records its code, whether it spun out or saw the word already
    set; the word ends at the smallest. Wait codes grow in program order, and a wait can be
    stuck only behind a producer stuck at an earlier wait, so the smallest names the wait whose
    own producers were not stuck: the wait made impossible. "The first wait to spin out" would
    not: a block with no items in the phases between can reach a later wait first and start
    spinning sooner (the H200, kernels.check's timeout case at 132 blocks of the tiny dims:
    blocks 8 to 11 have layer 1's qkv pairs and no output-projection, mlp or down rows, so
    their qkv wait spun out before the impossible mlp-up wait did)."""
    old = cuda.atomic.cas(counter, SLOT_ERR, numba.int32(0), numba.int32(code))
    while old != 0 and old > code:
        seen = cuda.atomic.cas(counter, SLOT_ERR, old, numba.int32(code))
        if seen == old:
            break
        old = seen


def _make_wait(spin: bool):
    """wait_count (spin False: `backoff` between polls) or wait_count_spin (polls back to back)."""

    @cuda.jit(device=True)
    def wait(counter, slot, base, target, code):
        """Return, in every thread of the block, once counter[slot] - base >= target (an int32
        difference: a count that wrapped around still compares right; base: the epoch form's
        E * launch_adds(slot), 0 in the arrive form): thread 0 polls it with acquire loads, then
        the block meets (its later reads see what the counted producers wrote).
        Bounded: after SPIN_LIMIT polls, or once the error word is set by another wait, thread 0
        records `code` in counter[SLOT_ERR] (record_give_up: the word keeps the smallest code, the
        wait made impossible) and stops waiting; the step's result is then void and the host says
        which wait gave up. Every thread of the block must call it. (wait_count_spin: the same
        with no backoff between polls, the spin variants' wait.)"""
        if cuda.threadIdx.x == 0:
            polls = 0
            while _wrap32(numba.int64(acquire_load(counter, slot)) - base) < target:
                polls += 1
                if polls >= SPIN_LIMIT or (polls % GIVE_UP_EVERY == 0
                                           and acquire_load(counter, SLOT_ERR) != 0):
                    record_give_up(counter, code)
                    break
                if not spin:
                    backoff()
        cuda.syncthreads()

    return wait


wait_count = _make_wait(False)
wait_count_spin = _make_wait(True)


@cuda.jit(device=True)
def bump(counter, slot, n):
    """counter[slot] += n once the block's writes are done: the block meets, then thread 0
    adds with release. Every thread of the block must call it."""
    cuda.syncthreads()
    if cuda.threadIdx.x == 0 and n > 0:
        release_add(counter, slot, n)


@cuda.jit(device=True)
def block_pick(logits, tokens, nxt, tid, red_v, red_i):
    """tokens[nxt] = argmax(logits), kernels/sample.py's pick_next for a block of any size: a
    strided scan per thread (NaN never taken, ties to the lower index), then a tree over the
    block with `better` (a total order: the winner does not depend on the pairing). red_v, red_i:
    shared [threads]. Every thread of the block must call it."""
    T = cuda.blockDim.x
    V = logits.shape[0]
    bv = numba.float32(-math.inf)
    bi = numba.int32(V)                   # "none yet": loses every comparison on index
    for i in range(tid, V, T):
        v = logits[i]
        if v > bv or (v == bv and i < bi):
            bv = v
            bi = numba.int32(i)
    red_v[tid] = bv
    red_i[tid] = bi
    cuda.syncthreads()
    s = 1
    while s < T:
        s *= 2
    s //= 2
    while s > 0:
        if tid < s and tid + s < T:
            if better(red_v[tid + s], red_i[tid + s], red_v[tid], red_i[tid]):
                red_v[tid] = red_v[tid + s]
                red_i[tid] = red_i[tid + s]
        cuda.syncthreads()
        s //= 2
    if tid == 0:
        best = red_i[0]
        tokens[nxt] = best if best < V else 0   # V: every logit was NaN


if SHUFFLES:
    from kernels.reduce import warp_argmax

    @cuda.jit(device=True)
    def warp_pick(logits, tokens, nxt, tid, red_v, red_i):
        """block_pick's id by warp 0 alone: a strided scan per lane (NaN never taken, ties to
        the lower index), then a butterfly of shuffles with `better` (a total order: any pairing
        picks the same id), no barrier. red_v, red_i: unused (block_pick's signature). Every
        thread of the block may call it; warp 0 does the work."""
        if tid < WARP:
            V = logits.shape[0]
            bv = numba.float32(-math.inf)
            bi = numba.int32(V)               # "none yet": loses every comparison on index
            i = tid
            while i < V:
                v = logits[i]
                if v > bv or (v == bv and i < bi):
                    bv = v
                    bi = numba.int32(i)
                i += WARP
            bi = warp_argmax(bv, bi)
            if tid == 0:
                tokens[nxt] = bi if bi < V else 0   # V: every logit was NaN
else:
    warp_pick = block_pick   # numba's simulator has no shuffles: the same id by the block's tree


STAMP_FIELDS = 7   # per (block, phase): clock64 at start, ready, end; globaltimer at the same
                   # three; the items the block did


@cuda.jit(device=True)
def stamp(stamps, blk, ph, which):
    """stamps[blk, ph, which] = clock64, stamps[blk, ph, 3 + which] = globaltimer (thread 0)."""
    if cuda.threadIdx.x == 0:
        stamps[blk, ph, which] = clock64()
        stamps[blk, ph, 3 + which] = globaltimer()


# ---- the twin: the fused step's twins (grid tail), composed ------------------------------------
def _make_twin(epochs: bool):
    """The twin of a variant: the fused step's twins (grid tail), composed, then the counter as
    a clean launch leaves it (epochs: every count and E advanced by launch_adds; arrive: every
    count 0). The error word stays as it was."""

    def twin(grid, block, tokens, pos, n_prompt, wte, norms, wqkv, wo, w_gu, w_down, final_norm,
             lm_head, eps, scale, cos, sin, k_cache, v_cache, x, q, part_o, part_ml, act, logits,
             counter):
        # embed, then per layer norm_qkv_rope, attn_fused_grid (attn_partial + attn_combine),
        # norm_swiglu, matvec_residual, then norm_lm_head_argmax: the kernel's phases, each the
        # twin of the fused kernel whose device functions it calls
        embed_twin(None, None, tokens, pos, wte, x)
        for layer in range(wqkv.shape[0]):
            norm_qkv_rope_twin(None, None, x, norms[layer, 0], eps, wqkv[layer], 0, pos, cos,
                               sin, q, k_cache[layer], v_cache[layer])
            attn_fused_grid_twin(None, None, q, k_cache[layer], v_cache[layer], pos, part_o,
                                 part_ml, scale, wo[layer], x, counter)
            norm_swiglu_twin(None, None, x, norms[layer, 1], eps, w_gu[layer, 0], w_gu[layer, 1],
                             act)
            matvec_residual_twin(None, None, w_down[layer], act, x)
        norm_lm_head_argmax_twin(None, None, x, final_norm, eps, lm_head, logits, pos, n_prompt,
                                 tokens, counter)
        if epochs:
            adds = launch_adds(wqkv.shape[0], x.shape[0], act.shape[0], logits.shape[0],
                               part_o.shape[0], part_o.shape[2])
            now = counter.astype(np.int64)
            counter[SLOT_EXIT:] = [wrap32(int(v)) for v in now[SLOT_EXIT:] + adds[SLOT_EXIT:]]
        else:
            counter[SLOT_EXIT:] = 0

    twin.__name__ = twin.__qualname__ = "step_persistent_twin"
    return twin


step_persistent_twin = _make_twin(VARIANTS[DEFAULT_VARIANT]["epochs"])


# ---- the kernel --------------------------------------------------------------------------------
def _make_body(stamped: bool, preload: bool, epochs: bool, lean: bool = False,
               spin: bool = False, merge1: bool = False, wo_pre: bool = False,
               wpick: bool = False, tails: bool = False, noproj: bool = False):
    """step_persistent's body; stamped: thread 0 of each block writes STAMP_FIELDS per phase
    into stamps [grid, phase_count(L), STAMP_FIELDS] int64 (the plain kernel passes a dummy and
    compiles no stamp); preload, epochs, lean, spin, merge1, wo_pre, wpick, tails: the
    compile-time choices of `VARIANTS` (each variant writes the same bits) and, noproj, of
    `PROBES` (a phase left out: not the step's bits)."""
    if tails and (epochs or merge1):
        raise ValueError("the tails body has the arrive exit and merges with merge_weights")
    if noproj and not tails:
        raise ValueError("noproj leaves the tails body's output projection out")
    waitc = wait_count_spin if spin else wait_count
    pick_id = warp_pick if wpick else block_pick
    pre_o = preload or wo_pre          # the output projection's row loaded before its wait

    @cuda.jit(device=True)
    def persistent_body(tokens, pos, n_prompt, wte, norms, wqkv, wo, w_gu, w_down, final_norm,
                        lm_head, eps, scale, cos, sin, k_cache, v_cache, x, q, part_o, part_ml,
                        act, logits, counter, stamps):
        red = cuda.shared.array((ATTN_STEPS, PERSISTENT_THREADS), numba.float32)  # partial's trees
        o_w = cuda.shared.array((ATTN_WARPS, MAX_HEAD_DIM), numba.float32)  # partial: o per warp
        ml_w = cuda.shared.array((ATTN_WARPS, 2), numba.float32)            # partial: (m, l) per warp
        o_sh = cuda.shared.array(MAX_D, numba.float32)                   # out proj: merged o [D]
        ml_sh = cuda.shared.array((MERGE_MAX_PAIRS, 2), numba.float32)   # out proj: (m, l) pairs
        w_sh = cuda.shared.array(MERGE_MAX_PAIRS, numba.float32)         # out proj: merge weights
        red1 = cuda.shared.array(PERSISTENT_THREADS, numba.float32)      # row trees; argmax values
        best_i = cuda.shared.array(PERSISTENT_THREADS, numba.int32)      # argmax indices
        flag = cuda.shared.array(1, numba.int32)
        ak = cuda.local.array(XW_UNROLL, numba.float32)    # [unroll] a row's first loads
        bk = cuda.local.array(XW_UNROLL, numba.float32)    # [unroll] the pair's second row's
        wk = cuda.local.array(XW_UNROLL, numba.float32)    # [unroll] the norm's weights
        rk = cuda.local.array(ROW_UNROLL, numba.float32)   # [unroll] a plain row's first loads
        tid = cuda.threadIdx.x
        lane = tid % WARP
        T = cuda.blockDim.x
        warp = tid // WARP
        blk = cuda.blockIdx.x
        G = cuda.gridDim.x
        GW = G * (T // WARP)           # warps in the grid: one round of a warp phase
        wg = warp * G + blk            # this warp's item in round 0 (items round-robin on blocks)
        D = x.shape[0]
        F = act.shape[0]
        V = logits.shape[0]
        half = cos.shape[1]
        hd = 2 * half
        H = part_o.shape[0]
        splits = part_o.shape[1]
        n_items = H * splits
        n_pairs = 3 * (D // 2)
        L = wqkv.shape[0]
        p = pos[0]                     # every block reads it here; the picker advances it
        use_tails = tails and F >= D   # the merged o lives in act, free between the layer
                                       # before's down projection and this layer's mlp up
        emb = wte[tokens[p]]           # [D] the embedding row: layer 0's x
        # the epoch form's bases: E launches' adds (launch_adds) under every count
        ep = numba.int64(counter[SLOT_EPOCH]) if epochs else numba.int64(0)
        b_xd = ep * (L * D)            # SLOT_X_DOWN
        b_xa = ep * (L * D)            # SLOT_X_ATTN (each adds L * D a launch)
        b_act = ep * (L * F)
        b_part = ep * (L * MERGE_MAX_PAIRS)   # every launch's whole (the picker tops it up)
        b_qkv = ep * (L * 3 * half)
        for layer in range(L):
            xin = emb if layer == 0 else x
            ph = layer * 5
            # ---- qkv: norm_qkv_rope, a warp per rotate-half pair of q, k or v
            if stamped:
                stamp(stamps, blk, ph, 0)
            W = wqkv[layer]
            wn = norms[layer, 0]
            if lean and blk < n_pairs:
                # round 0's pair and its rotary factors, loaded before the wait (the values
                # and arithmetic of the default's loop below, its indices by udivmod)
                Dh = D >> 1
                pair = numba.int64(wg)
                own, rem = udivmod(pair, Dh)
                head, j = udivmod(rem, half)
                valid = pair < n_pairs
                c = numba.float32(0.0)
                s = numba.float32(0.0)
                if valid and lane < 2 and own != 2:
                    c = cos[p, j]
                    s = sin[p, j]
                if layer > 0:
                    waitc(counter, SLOT_X_DOWN, b_xd, layer * D, _wait_code(layer, 0, 0))
                if stamped:
                    stamp(stamps, blk, ph, 1)
                base = 0
                while base < n_pairs:
                    if base > 0:
                        pair = base + wg
                        own, rem = udivmod(pair, Dh)
                        head, j = udivmod(rem, half)
                        valid = pair < n_pairs
                        if valid and lane < 2 and own != 2:
                            c = cos[p, j]
                            s = sin[p, j]
                    lo_row = own * D + head * hd + j
                    if not valid:
                        lo_row = W.shape[0]                     # no rows: the warp still reduces
                    lo, hi, ss = xw_dot2(W, lo_row, W, lo_row + half, xin, wn, tid, red1)
                    inv = inv_rms(ss, D, eps)
                    lo = lo * inv
                    hi = hi * inv
                    if valid and lane < 2:
                        i = head * hd + j + lane * half
                        if own == 2:
                            v_cache[layer, p, i] = lo if lane == 0 else hi
                        else:
                            val = lo * c - hi * s if lane == 0 else hi * c + lo * s
                            if own == 0:
                                q[i] = val
                            else:
                                k_cache[layer, p, i] = val
                    base += GW
            elif blk < n_pairs:
                if not preload and layer > 0:
                    waitc(counter, SLOT_X_DOWN, b_xd, layer * D, _wait_code(layer, 0, 0))
                if stamped and not preload:
                    stamp(stamps, blk, ph, 1)
                base = 0
                while base < n_pairs:
                    pair = base + wg
                    valid = pair < n_pairs
                    own = pair // (D // 2)                      # 0 q, 1 k, 2 v
                    head = (pair % (D // 2)) // half
                    j = pair % half
                    lo_row = own * D + head * hd + j
                    if not valid:
                        lo_row = W.shape[0]                     # no rows: the warp still reduces
                    if preload:
                        xw_load(W, lo_row, W, lo_row + half, wn, tid, ak, bk, wk)
                        if base == 0 and layer > 0:
                            waitc(counter, SLOT_X_DOWN, b_xd, layer * D,
                                  _wait_code(layer, 0, 0))
                        if stamped and base == 0:
                            stamp(stamps, blk, ph, 1)
                        lo, hi, ss = xw_dot2_loaded(W, lo_row, W, lo_row + half, xin, wn, tid,
                                                    red1, ak, bk, wk)
                    else:
                        lo, hi, ss = xw_dot2(W, lo_row, W, lo_row + half, xin, wn, tid, red1)
                    inv = inv_rms(ss, D, eps)
                    lo = lo * inv
                    hi = hi * inv
                    if valid and lane < 2:
                        i = head * hd + j + lane * half
                        if own == 2:
                            v_cache[layer, p, i] = lo if lane == 0 else hi
                        else:
                            c = cos[p, j]
                            s = sin[p, j]
                            val = lo * c - hi * s if lane == 0 else hi * c + lo * s
                            if own == 0:
                                q[i] = val
                            else:
                                k_cache[layer, p, i] = val
                    base += GW
            cuda.syncthreads()
            hh = tid
            while hh < H:                                   # the block's pairs of head hh
                cnt = 0
                i = blk
                while i < n_pairs:
                    if lean:
                        _, rem_i = udivmod(numba.int64(i), D >> 1)
                        h_i, _ = udivmod(rem_i, half)
                    else:
                        h_i = (i % (D // 2)) // half
                    if h_i == hh:
                        cnt += 1
                    i += G
                if cnt > 0:
                    release_add(counter, SLOT_QKV + hh, cnt)
                hh += T
            if stamped:
                stamp(stamps, blk, ph, 2)
                if tid == 0:
                    stamps[blk, ph, 6] = _mine(n_pairs, blk, G)

            # ---- attention: attn_partial's items (head, slice), each after its head's q, k, v
            if stamped:
                stamp(stamps, blk, ph + 1, 0)
            item = blk
            while item < n_items:
                h, s = udivmod(item, splits)
                waitc(counter, SLOT_QKV + h, b_qkv,
                      (layer + 1) * 3 * half + (layer * splits if use_tails else 0),
                      _wait_code(layer, 1, h))
                if stamped and item == blk:
                    stamp(stamps, blk, ph + 1, 1)
                partial_slice_at(q, k_cache[layer], v_cache[layer], p + 1, part_o, part_ml, scale,
                                 red, o_w, ml_w, h, s, splits)
                whole = (layer + 1) * (3 * half + splits)
                if use_tails and arrive_last(counter, SLOT_QKV + h, whole, flag, False):
                    merge_weights(part_ml, h, 1, ml_sh, w_sh)     # the head's slices only
                    d = tid
                    while d < hd:                               # o_h into act's first D
                        act[h * hd + d] = merge_elem_sh(part_o, ml_sh, w_sh, 0, h, d)
                        d += T
                    bump(counter, SLOT_PART, 1)                 # one head merged
                item += G
            if not use_tails:
                bump(counter, SLOT_PART, _mine(n_items, blk, G))
            if stamped:
                stamp(stamps, blk, ph + 1, 2)
                if tid == 0:
                    stamps[blk, ph + 1, 6] = _mine(n_items, blk, G)

            # ---- output projection: attn_combine's merge and rows, x = xin + Wo @ o
            if stamped:
                stamp(stamps, blk, ph + 2, 0)
            Wo = wo[layer]
            if blk < D and not noproj:
                base = 0
                while base < D:
                    r = base + wg
                    if pre_o:
                        row_load(Wo, r, tid, rk)                # Wo's row in flight meanwhile
                    if base == 0:        # every partial, or (tails) every merged head
                        waitc(counter, SLOT_PART, b_part,
                              (layer + 1) * (H if use_tails else n_items),
                              _wait_code(layer, 2, 0))
                        if stamped:
                            stamp(stamps, blk, ph + 2, 1)
                    if base == 0 and not use_tails:
                        if not merge1:
                            merge_weights(part_ml, 0, H, ml_sh, w_sh)
                        i = tid
                        while i < H * hd:
                            hh, d = udivmod(i, hd)
                            if merge1:
                                o_sh[i] = merge_elem_batch(part_o, part_ml, hh, d)
                            else:
                                o_sh[i] = merge_elem_sh(part_o, ml_sh, w_sh, hh * splits, hh, d)
                            i += T
                        cuda.syncthreads()
                    if use_tails:                               # the merged o: act
                        if pre_o:
                            dot = row_dot_loaded(Wo, r, act, tid, red1, rk)
                        else:
                            dot = row_dot(Wo, r, act, tid, red1)
                    elif pre_o:
                        dot = row_dot_loaded(Wo, r, o_sh, tid, red1, rk)
                    else:
                        dot = row_dot(Wo, r, o_sh, tid, red1)
                    if lane == 0 and r < D:
                        x[r] = xin[r] + dot
                    base += GW
            if not noproj:
                bump(counter, SLOT_X_ATTN, _mine(D, blk, G))
            if stamped:
                if noproj:
                    stamp(stamps, blk, ph + 2, 1)
                stamp(stamps, blk, ph + 2, 2)
                if tid == 0:
                    stamps[blk, ph + 2, 6] = _mine(D, blk, G)

            # ---- mlp up: norm_swiglu, a warp per row
            if stamped:
                stamp(stamps, blk, ph + 3, 0)
            Wg = w_gu[layer, 0]
            Wu = w_gu[layer, 1]
            wn = norms[layer, 1]
            xm = xin if noproj else x      # noproj: no output projection wrote x
            if blk < F:
                base = 0
                while base < F:
                    r = base + wg
                    if preload:
                        xw_load(Wg, r, Wu, r, wn, tid, ak, bk, wk)
                    if base == 0:
                        if noproj:                  # the heads' merged outputs, as out proj
                            waitc(counter, SLOT_PART, b_part, (layer + 1) * H,
                                  _wait_code(layer, 3, 0))
                        else:
                            waitc(counter, SLOT_X_ATTN, b_xa, (layer + 1) * D,
                                  _wait_code(layer, 3, 0))
                        if stamped:
                            stamp(stamps, blk, ph + 3, 1)
                    if preload:
                        g, u, ss = xw_dot2_loaded(Wg, r, Wu, r, xm, wn, tid, red1, ak, bk, wk)
                    else:
                        g, u, ss = xw_dot2(Wg, r, Wu, r, xm, wn, tid, red1)
                    inv = inv_rms(ss, D, eps)
                    g = g * inv
                    u = u * inv
                    if lane == 0 and r < F:
                        act[r] = (g / (numba.float32(1.0) + math.exp(-g))) * u
                    base += GW
            bump(counter, SLOT_ACT, _mine(F, blk, G))
            if stamped:
                stamp(stamps, blk, ph + 3, 2)
                if tid == 0:
                    stamps[blk, ph + 3, 6] = _mine(F, blk, G)

            # ---- down + residual: matvec_residual, a warp per row
            if stamped:
                stamp(stamps, blk, ph + 4, 0)
            Wd = w_down[layer]
            if blk < D:
                base = 0
                while base < D:
                    r = base + wg
                    if preload:
                        row_load(Wd, r, tid, rk)
                    if base == 0:
                        waitc(counter, SLOT_ACT, b_act, (layer + 1) * F,
                              _wait_code(layer, 4, 0))
                        if stamped:
                            stamp(stamps, blk, ph + 4, 1)
                    if preload:
                        dot = row_dot_loaded(Wd, r, act, tid, red1, rk)
                    else:
                        dot = row_dot(Wd, r, act, tid, red1)
                    if lane == 0 and r < D:
                        x[r] = xm[r] + dot
                    base += GW
            bump(counter, SLOT_X_DOWN, _mine(D, blk, G))
            if stamped:
                stamp(stamps, blk, ph + 4, 2)
                if tid == 0:
                    stamps[blk, ph + 4, 6] = _mine(D, blk, G)

        # ---- LM head: norm_lm_head_argmax's rows, a warp per logit
        ph = L * 5
        if stamped:
            stamp(stamps, blk, ph, 0)
        if blk < V:
            base = 0
            while base < V:
                r = base + wg
                if preload:
                    xw_load1(lm_head, r, lm_head, r, final_norm, tid, ak, ak, wk)
                if base == 0:
                    waitc(counter, SLOT_X_DOWN, b_xd, L * D, _wait_code(L, PHASE_LM, 0))
                    if stamped:
                        stamp(stamps, blk, ph, 1)
                if preload:
                    dot, ss = xw_dot_loaded(lm_head, r, x, final_norm, tid, red1, ak, wk)
                else:
                    dot, ss = xw_dot(lm_head, r, x, final_norm, tid, red1)
                if lane == 0 and r < V:
                    logits[r] = dot * inv_rms(ss, D, eps)
                base += GW
        if epochs:
            bump(counter, SLOT_LOGITS, _mine(V, blk, G))
        if stamped:
            stamp(stamps, blk, ph, 2)
            stamp(stamps, blk, ph + 1, 0)
            if tid == 0:
                stamps[blk, ph, 6] = _mine(V, blk, G)
        # ---- exit. epoch: the grid's last block waits for every logit, picks the token and
        # advances pos and E (every block with an item read both before its first item, and every
        # item is upstream of the logits); no other block waits. Every wait on the partials is
        # upstream too, so the top-up cannot meet one early. arrive: the last block to
        # arrive picks, advances pos and zeroes the counts.
        if epochs:
            pick = blk == G - 1
            if pick:
                waitc(counter, SLOT_LOGITS, ep * V, V, _wait_code(L, PHASE_PICK, 0))
                if tid == 0:   # the partials' count to a launch's whole, whatever the splits
                    release_add(counter, SLOT_PART, L * (MERGE_MAX_PAIRS - n_items))
        else:
            pick = arrive_last(counter, SLOT_EXIT, G, flag, True)
        if pick:
            if stamped:
                stamp(stamps, blk, ph + 1, 1)
            nxt = p + 1
            if nxt < tokens.shape[0] and nxt >= n_prompt[0]:    # uniform over the block
                pick_id(logits, tokens, nxt, tid, red1, best_i)
            if tid == 0:
                pos[0] = nxt
                if epochs:
                    counter[SLOT_EPOCH] = ep + 1     # int32: wraps around, as the counts do
                else:
                    for sl in range(SLOT_EXIT + 1, counter.shape[0]):
                        counter[sl] = 0              # every block is past its last wait
            if stamped and tid == 0:
                stamps[blk, ph + 1, 6] = 1
        if stamped:
            stamp(stamps, blk, ph + 1, 2)

    return persistent_body


def _make_kernel(body, stamped: bool):
    """A kernel around `body` (cooperative, PDL's wait first): the registered step_persistent's
    form, or with stamps (the stamped form's last argument)."""
    if stamped:
        def kern(tokens, pos, n_prompt, wte, norms, wqkv, wo, w_gu, w_down, final_norm, lm_head,
                 eps, scale, cos, sin, k_cache, v_cache, x, q, part_o, part_ml, act, logits,
                 counter, stamps):
            pdl_wait()
            require_cooperative()
            body(tokens, pos, n_prompt, wte, norms, wqkv, wo, w_gu, w_down, final_norm, lm_head,
                 eps, scale, cos, sin, k_cache, v_cache, x, q, part_o, part_ml, act, logits,
                 counter, stamps)
    else:
        def kern(tokens, pos, n_prompt, wte, norms, wqkv, wo, w_gu, w_down, final_norm, lm_head,
                 eps, scale, cos, sin, k_cache, v_cache, x, q, part_o, part_ml, act, logits,
                 counter):
            pdl_wait()
            require_cooperative()
            stamps = cuda.local.array((1, 1, STAMP_FIELDS), numba.int64)   # unused: no stamp
            body(tokens, pos, n_prompt, wte, norms, wqkv, wo, w_gu, w_down, final_norm, lm_head,
                 eps, scale, cos, sin, k_cache, v_cache, x, q, part_o, part_ml, act, logits,
                 counter, stamps)
    return kern


_BODIES = {(name, st): _make_body(st, **choice)
           for name, choice in {**VARIANTS, **PROBES}.items() for st in (False, True)}
_body = _BODIES[DEFAULT_VARIANT, False]
_body_stamped = _BODIES[DEFAULT_VARIANT, True]

_SIG = ("void(int32[::1], int32[::1], int32[::1], float32[:, ::1], float32[:, :, ::1], "
        "float32[:, :, ::1], float32[:, :, ::1], float32[:, :, :, ::1], float32[:, :, ::1], "
        "float32[::1], float32[:, ::1], float32, float32, float32[:, ::1], float32[:, ::1], "
        "{kv}[:, :, ::1], {kv}[:, :, ::1], float32[::1], float32[::1], float32[:, :, ::1], "
        "float32[:, :, ::1], float32[::1], float32[::1], int32[::1]{extra})")
STAMPED_SIGS = tuple(_SIG.format(kv=kv, extra=", int64[:, :, ::1]") for kv in ("float32", "float16"))


@kernel(_SIG.format(kv="float32", extra=""), _SIG.format(kv="float16", extra=""),
        twin=step_persistent_twin,
        reads=(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 13, 14, 15, 16, 23),
        writes=(0, 1, 15, 16, 17, 18, 19, 20, 21, 22, 23),
        jit_options={"launch_bounds": (PERSISTENT_THREADS,)})
def step_persistent(tokens, pos, n_prompt, wte, norms, wqkv, wo, w_gu, w_down, final_norm,
                    lm_head, eps, scale, cos, sin, k_cache, v_cache, x, q, part_o, part_ml, act,
                    logits, counter):
    """One decode step in one cooperative launch: the fused step's phases (LAB_ATTN_TAIL=grid),
    each waiting only for the counts of what it reads.

    tokens [max_seq], pos [1], n_prompt [1] int32; wte [V, D]; norms [L, 2, D] (attention's,
    the MLP's); wqkv [L, 3D, D]; wo [L, D, D]; w_gu [L, 2, F, D] (gate, up); w_down [L, D, F];
    final_norm [D]; lm_head [V, D]; cos/sin [max_seq, hd/2]; k_cache/v_cache [L, max_seq, D];
    x, q [D]; part_o [n_head, splits, hd], part_ml [n_head, splits, 2] (the plan's view);
    act [F]; logits [V]; counter [counter_slots(n_head)] int32: the error word, then the
    counts as clean launches leave them (`settled`: zeros to start with). Grid
    persistent_geometry (any number of co-resident blocks), block PERSISTENT_THREADS = 128.
    Its body is VARIANTS[DEFAULT_VARIANT] (tails/arrive: each head merged once by the block its
    last slice elects, the arrive exit);
    `variant_spec` gives the others, unregistered, for scripts/megakernel_probe.py.

    One token (items go round-robin over the blocks, so every phase spreads over every SM; a
    "wait" is `wait_count` on one count, above the launch's base E * launch_adds, a "bump" the
    block's release-add to it):
      qkv        norm_qkv_rope's warps, a warp per rotate-half pair (the norm folded): wait x
                 (every down row of the layer before; layer 0 reads the embedding row
                 itself), then the pair's rows; bump each head's count
      attention  attn_partial's items (head, slice), a block each: wait for the item's head's
                 q, k, v pairs only (and the head's slices of the layers before); then
                 arrive_last on the head's count: the block whose slice completes it merges
                 the head into act[h*hd:(h+1)*hd] and bumps the merged heads' count
      out proj   attn_combine's rows, a warp per row of Wo: wait every merged head,
                 x[r] = xin[r] + Wo[r] . o; bump
      mlp up     norm_swiglu's rows: wait every out-proj row, then gate and up; bump
      down       matvec_residual's rows: wait every act row, x[r] += Wd[r] . act; bump
      LM head    norm_lm_head_argmax's rows: wait every down row of the last layer; bump the
                 logits' count
      exit       every block arrives at the exit's count (arrive_last); the last picks the id
                 (warp_pick), advances pos and sets every count back to 0 for the next launch
    (The plain body's out proj waits for every partial and merges all of o in every block; the
    epoch exit's last block waits for every logit and resets nothing: VARIANTS.)
    Every wait is on phases before it, whose items every block does before its own later
    phases, so with every block resident (the cooperative launch) nothing waits for ever, for
    any grid >= 1: one block does everything in order (numba's simulator runs exactly that).
    No result depends on which block does an item or arrives first: each item's arithmetic is
    its fused kernel's, whoever runs it, and the counts only say when to read.

    Bounded: a wait gives up after SPIN_LIMIT polls and writes its `wait_code` to the error
    word (lab/engine/persistent.py reads it after a decode, zeroes the counter and raises a
    DeviceFault naming the wait); the other waits then stop at their next look at it. Limits: head_dim <= 128, D <=
    MAX_D, n_head * splits <= MERGE_MAX_PAIRS, the grid co-resident.
    """
    pdl_wait()
    require_cooperative()
    stamps = cuda.local.array((1, 1, STAMP_FIELDS), numba.int64)   # unused: no stamp compiled
    _body(tokens, pos, n_prompt, wte, norms, wqkv, wo, w_gu, w_down, final_norm, lm_head, eps,
          scale, cos, sin, k_cache, v_cache, x, q, part_o, part_ml, act, logits, counter, stamps)


def step_persistent_stamped(tokens, pos, n_prompt, wte, norms, wqkv, wo, w_gu, w_down,
                            final_norm, lm_head, eps, scale, cos, sin, k_cache, v_cache, x, q,
                            part_o, part_ml, act, logits, counter, stamps):
    """`step_persistent` with stamps [grid, phase_count(L), STAMP_FIELDS] int64: per block and
    phase, clock64 and globaltimer at its start, when its wait returned (its start where it
    waits for nothing; 0 where the block has no item) and its end, then its item count. Not
    registered (no step runs it): scripts/megakernel_probe.py and kernels/check.py compile it
    with STAMPED_SIGS (`variant_kernel(name, stamped=True)`: any variant's)."""
    pdl_wait()
    require_cooperative()
    _body_stamped(tokens, pos, n_prompt, wte, norms, wqkv, wo, w_gu, w_down, final_norm, lm_head,
                  eps, scale, cos, sin, k_cache, v_cache, x, q, part_o, part_ml, act, logits,
                  counter, stamps)


def variant_kernel(name: str, stamped: bool = False):
    """The Python source of variant `name`'s kernel (VARIANTS or PROBES), to compile with
    step_persistent's signatures (stamped: STAMPED_SIGS) and jit options; the default's is
    step_persistent's own (or step_persistent_stamped)."""
    if name == DEFAULT_VARIANT:
        return step_persistent_stamped if stamped else step_persistent.py_func
    return _make_kernel(_BODIES[name, stamped], stamped)


def variant_spec(name: str) -> KernelSpec:
    """Variant `name` as a KernelSpec the engine can launch (lab/engine/persistent.py's
    `variant_step`), named step_persistent[name]: step_persistent's signatures, reads, writes
    and jit options, the variant's twin. Not registered: no toggle selects it."""
    if name == DEFAULT_VARIANT:
        return step_persistent
    if name not in VARIANTS and name not in PROBES:
        raise ValueError(f"no persistent variant {name!r}; the variants: {', '.join(VARIANTS)}; "
                         f"the probes (timing only): {', '.join(PROBES)}")
    s = step_persistent
    twin = _make_twin(VARIANTS[name]["epochs"]) if name in VARIANTS else _probe_twin(name)
    return KernelSpec(f"step_persistent[{name}]", variant_kernel(name), s.signatures, twin,
                      s.reads, s.writes, s.doc, s.jit_options)


def _probe_twin(name: str):
    """A PROBES body's twin: none (it leaves work out; no backend may stand in for it)."""
    def twin(*args):
        raise ValueError(f"step_persistent[{name}] leaves work out (PROBES): it has no twin, so "
                         f"it runs on a GPU only, for timing")
    return twin


# ---- the cases kernels/check.py runs
CASES = {
    # numba's simulator runs blocks one after another, so a grid of more than one block would
    # spin for ever there: the kernel runs at grid (1,), one block doing every item in order.
    # One layer under the simulator; two on a GPU, at grids of 1, 2, 7 and 132 blocks
    "tiny": dict(L=1, D=8, H=2, hd=4, F=8, V=11, S=16, T=PERSISTENT_THREADS),
    "gpu_layers": 2,
    "gpu_grids": ((1,), (2,), (7,), (132,)),
    # (KV dtype, position, splits, n_prompt): a generated slot; a prompt slot (no token
    # written), an empty slice (L = 10 over 4 slices of 3) and a float16 cache. The simulator
    # runs the first
    "cases": [(np.float32, 5, 2, 3), (np.float16, 9, 4, 12)],
    "eps": 1e-5,
    "tol": (4e-5, 64),
    "why": "the fused kernels' widest tolerance (attention: atol 1e-5, k = 64, per kernel); a "
           "step chains 2 layers: atol 4x that",
}
