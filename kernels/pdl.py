"""Programmatic dependent launch (PDL) primitives for numba.cuda kernels.

Contents
  LATE_TRIGGER            the kernels that trigger their dependents after their main work
  pdl_wait                the dependent's wait (griddepcontrol.wait): every kernel's first statement
  pdl_launch_dependents   the primary's trigger (griddepcontrol.launch_dependents)

PDL takes three pieces, each guaranteeing something different (the comment above the
definitions says what). numba-cuda has no griddepcontrol intrinsics, so they are emitted as
inline PTX: nothing below sm_90, and no-op Python functions under numba's CUDA simulator.
"""
from numba import config

# The three pieces of PDL:
# 1. the launch attribute, on the DEPENDENT's launch: programmatic stream serialisation
#    (`cuda.core.LaunchConfig(programmatic_stream_serialization=True)` in lab/backend/cuda/
#    launch.py, under LAB_PDL=1). It lets the dependent launch before the kernel ahead of it has
#    finished; without it the other two pieces change nothing. It guarantees nothing about data.
# 2. the primary's trigger, `pdl_launch_dependents()`: once every block of the primary has
#    triggered (or exited), the dependent may start launching. A scheduling hint only: it
#    neither means the primary has finished nor makes its writes visible.
# 3. the dependent's wait, `pdl_wait()`: blocks until the grids this one depends on have
#    COMPLETED and their memory is visible. The only piece that orders data, so every kernel's
#    FIRST statement is `pdl_wait()` (lab/pdl_check.py enforces it). Without a programmatic
#    launch it returns at once.
# How much the dependent overlaps is up to the hardware: a gain, never something correctness
# relies on; dependencies outside one stream's chain still need events. That the step's bytes
# are the same with LAB_PDL=1 and 0 is checked (tests/backend/test_pdl.py), not assumed.
#
# Where the trigger goes is a performance choice, measured: most kernels trigger right after
# their wait, so the dependent's launch overlaps their whole run. The kernels below trigger
# after their main work: the split-K attention partials, whose grid (n_head, splits) fills
# nearly every SM at long context, so a dependent launched early finds only the few SMs left
# free. On the H200 at context 900 (splits 32) the early trigger made the edge into
# attn_combine cost 15.1 us per step and PDL lose 5.7 us per step against no PDL; with the
# trigger after the partials PDL saves 10.4 (data/gpu/pdl_context*.json, `decode-lab record
# pdl_context`). lab/pdl_check.py holds the kernels to it.
# (kernels/fused.py's attn_fused_grid does too, in its partial blocks; its tail blocks trigger
# once their wait is over. Two triggers in two branches: the static check below takes one
# trigger at the top level, so it is not listed; tests/engine/test_fusion.py holds it.)
LATE_TRIGGER = ("attn_partial", "attn_partial_wide", "attn_fused")

if config.ENABLE_CUDASIM:  # the simulator runs kernels as Python: nothing to emit

    def pdl_wait():
        pass

    def pdl_launch_dependents():
        pass

else:
    from llvmlite import ir
    from numba import types
    from numba.core.extending import intrinsic

    def _target_has_pdl() -> bool:
        from numba import cuda

        return cuda.get_current_device().compute_capability >= (9, 0)

    def _asm_intrinsic(ptx: str):
        @intrinsic
        def _emit(typingctx):
            def codegen(context, builder, sig, args):
                if _target_has_pdl():
                    fnty = ir.FunctionType(ir.VoidType(), [])
                    builder.asm(fnty, ptx, "~{memory}", [], side_effect=True)
                return context.get_dummy_value()

            return types.void(), codegen

        return _emit

    pdl_wait = _asm_intrinsic("griddepcontrol.wait;")
    pdl_launch_dependents = _asm_intrinsic("griddepcontrol.launch_dependents;")
