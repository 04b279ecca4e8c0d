"""How blocks of one launch hand data to each other through global memory: the one place kernels/
synchronises blocks (an atomic counts or elects, never sums: what a block computes after a count
reads every part in a fixed order, so no result depends on which block came first).

Contents
  memory order    release_add (`red.release.gpu`), acquire_load (`ld.acquire.gpu`), acq_rel_add
                  (`atom.acq_rel.gpu`): inline PTX on a GPU, sequentially consistent atomics on
                  numba's simulator
  counting        count_arrival (a block counts itself once its writes are done),
                  wait_arrivals (a block waits for a count), arrive_last (the block whose
                  arrival completes a count is elected, and may reset the slot), backoff
  flag in data    ll_store / ll_load (a float32 and an int32 tag in one 64-bit word: the
                  flag-in-data hand-off lab/measure/handoff.py times), ll_*_host their Python
                  forms

The pattern is CUTLASS's generic barrier: the block meets (`cuda.syncthreads`: its threads'
writes ordered before thread 0's), thread 0 counts with release semantics; a waiter's thread 0
reads the count with acquire semantics and the block meets again before reading what the counted
blocks wrote. No thread runs a sequentially consistent fence (`cuda.threadfence`): on the H200
the megakernel's exit election fell from 3.58 to 2.56 us when it dropped its fences for one
acq_rel atomic (scripts/megakernel_probe.py, data/gpu/megakernel_probe.txt's fifth printout).
"""
import numba
import numpy as np
from numba import config, cuda

__all__ = ["release_add", "acquire_load", "acq_rel_add", "count_arrival", "wait_arrivals",
           "arrive_last", "backoff", "ll_store", "ll_load", "ll_store_host", "ll_load_host"]


def ll_store_host(words, i, val, tag):
    """`ll_store` in Python (the simulator's form): words[i] (int64) = the tag in the high half,
    the float32's bits in the low half."""
    bits = int(np.float32(val).view(np.uint32))
    words[i] = np.uint64(((int(tag) & 0xFFFFFFFF) << 32) | bits).view(np.int64)


def ll_load_host(words, i):
    """`ll_load` in Python (the simulator's form): (val float32, tag int32) of words[i]."""
    w = int(np.int64(words[i]).view(np.uint64))
    return np.uint32(w & 0xFFFFFFFF).view(np.float32), np.uint32(w >> 32).view(np.int32)


# numba's simulator: its atomics are sequentially consistent and its blocks run one after
# another, so a wait never spins. The atomics' forms are device functions: the simulator lends
# `cuda.atomic` to a device function's module only while it runs
if config.ENABLE_CUDASIM:
    @cuda.jit(device=True)
    def release_add(ary, i, v):
        cuda.atomic.add(ary, i, v)

    @cuda.jit(device=True)
    def acquire_load(ary, i):
        return cuda.atomic.add(ary, i, 0)

    @cuda.jit(device=True)
    def acq_rel_add(ary, i, v):
        return cuda.atomic.add(ary, i, v)

    def backoff():
        pass

    ll_store = ll_store_host
    ll_load = ll_load_host

else:
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda.extending import intrinsic

    def _element_pointer(context, builder, aryty, ary, idxty, idx):
        arr = context.make_array(aryty)(context, builder, ary)
        i = context.cast(builder, idx, idxty, types.intp)
        return cgutils.get_item_pointer(context, builder, aryty, arr, [i], wraparound=False)

    @intrinsic
    def release_add(typingctx, ary, i, v):
        """ary[i] += v as `red.release.gpu` (int32): the writes this thread has made, and those
        its block's barrier ordered before it, are visible to whoever acquires the new count
        (CUTLASS's generic barrier's arrive)."""
        def codegen(context, builder, sig, args):
            ptr = _element_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            val = context.cast(builder, args[2], sig.args[2], types.int32)
            fnty = ir.FunctionType(ir.VoidType(), [ptr.type, ir.IntType(32)])
            builder.asm(fnty, "red.release.gpu.add.s32 [$0], $1;", "l,r,~{memory}",
                        [ptr, val], side_effect=True)
            return context.get_dummy_value()
        return types.void(ary, i, v), codegen

    @intrinsic
    def acquire_load(typingctx, ary, i):
        """ary[i] (int32) by `ld.acquire.gpu`: reads after it see every write released before
        the count it returns (CUTLASS's generic barrier's wait)."""
        def codegen(context, builder, sig, args):
            ptr = _element_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            fnty = ir.FunctionType(ir.IntType(32), [ptr.type])
            return builder.asm(fnty, "ld.acquire.gpu.s32 $0, [$1];", "=r,l,~{memory}",
                               [ptr], side_effect=True)
        return types.int32(ary, i), codegen

    @intrinsic
    def acq_rel_add(typingctx, ary, i, v):
        """ary[i] += v by `atom.acq_rel.gpu` (int32), returning the old count: a release of the
        writes this thread has made and those its block's barrier ordered before it, and an
        acquire for the reads after it (and, after a barrier, its block's): release_add and
        acquire_load in one atomic (arrive_last's)."""
        def codegen(context, builder, sig, args):
            ptr = _element_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            val = context.cast(builder, args[2], sig.args[2], types.int32)
            fnty = ir.FunctionType(ir.IntType(32), [ptr.type, ir.IntType(32)])
            return builder.asm(fnty, "atom.acq_rel.gpu.add.s32 $0, [$1], $2;", "=r,l,r,~{memory}",
                               [ptr, val], side_effect=True)
        return types.int32(ary, i, v), codegen

    @intrinsic
    def ll_store(typingctx, words, i, val, tag):
        """words[i] = (tag, val) as ONE 64-bit relaxed store at device scope
        (`st.relaxed.gpu.b64`): the float32's bits in the low half, the int32 tag in the high
        half. A reader's 64-bit load sees both halves of one store or neither (single-copy
        atomic), so a matching tag vouches for the value beside it with no fence (NCCL's LL
        protocol: the flag travels in the data)."""
        def codegen(context, builder, sig, args):
            ptr = _element_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            v = builder.bitcast(context.cast(builder, args[2], sig.args[2], types.float32),
                                ir.IntType(32))
            t = context.cast(builder, args[3], sig.args[3], types.int32)
            fnty = ir.FunctionType(ir.VoidType(), [ptr.type, ir.IntType(32), ir.IntType(32)])
            builder.asm(fnty, "{ .reg .b64 w; mov.b64 w, {$1, $2}; "
                              "st.relaxed.gpu.b64 [$0], w; }",
                        "l,r,r,~{memory}", [ptr, v, t], side_effect=True)
            return context.get_dummy_value()
        return types.void(words, i, val, tag), codegen

    @intrinsic
    def ll_load(typingctx, words, i):
        """(val, tag) of words[i] by ONE 64-bit relaxed load at device scope
        (`ld.relaxed.gpu.b64`): ll_store's word, both halves from the same store."""
        def codegen(context, builder, sig, args):
            ptr = _element_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            pair = ir.LiteralStructType([ir.IntType(32), ir.IntType(32)])
            fnty = ir.FunctionType(pair, [ptr.type])
            res = builder.asm(fnty, "{ .reg .b64 w; ld.relaxed.gpu.b64 w, [$2]; "
                                    "mov.b64 {$0, $1}, w; }",
                              "=r,=r,l,~{memory}", [ptr], side_effect=True)
            val = builder.bitcast(builder.extract_value(res, 0), ir.FloatType())
            return context.make_tuple(builder, sig.return_type,
                                      [val, builder.extract_value(res, 1)])
        return types.Tuple((types.float32, types.int32))(words, i), codegen

    @cuda.jit(device=True)
    def backoff():
        cuda.nanosleep(64)  # a spinning thread yields its issue slots to the working blocks


@cuda.jit(device=True)
def count_arrival(counter, slot):
    """Count this block in counter[slot] once its writes are done: the block meets, then thread
    0 adds 1 with release semantics (release_add). Nothing is elected: `wait_arrivals` in other
    blocks reads the count. Every thread of the block must call it."""
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        release_add(counter, slot, numba.int32(1))


@cuda.jit(device=True)
def wait_arrivals(counter, slot, arrivals):
    """Return, in every thread of the block, once counter[slot] has reached `arrivals`: thread 0
    polls it with acquire loads, backing off between polls; then the block meets (its later
    reads see what the counted blocks wrote). Unbounded: safe only when every counted block has
    started before this one spins (kernels/fused.py attn_fused_grid: why it holds there; the
    megakernel's waits are bounded, kernels/persistent.py wait_count)."""
    if cuda.threadIdx.x == 0:
        while acquire_load(counter, slot) < arrivals:
            backoff()
    cuda.syncthreads()


@cuda.jit(device=True)
def arrive_last(counter, slot, whole, flag, reset):
    """True, in every thread of the block, for the block whose arrival makes counter[slot]
    `whole`; with reset, that block sets the slot back to 0 (every other block has counted:
    clean for the next launch), else the slot keeps counting.

    Every thread calls it once its writes of the block's part are done: the block meets, then
    thread 0 counts it by ONE acq_rel atomic (acq_rel_add), whose release covers the block's
    writes the barrier ordered before it and whose acquire, with the barrier after it, orders
    the elected block's later reads after every counted block's writes. flag: shared [1] int32.

    For work that needs other blocks' outputs (a head's merge needs every split of it; the
    argmax every logit): the counter only ELECTS the block that does it, which reads every part
    in a fixed order, so the result never depends on which block finished last and the kernels
    stay bit-reproducible, replay after replay. No block waits for another (no spin), so nothing
    depends on how many blocks are resident."""
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        old = acq_rel_add(counter, slot, numba.int32(1))
        last = old == whole - 1
        flag[0] = 1 if last else 0
        if last and reset:
            counter[slot] = 0
    cuda.syncthreads()
    return flag[0] == 1
