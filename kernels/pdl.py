"""Programmatic dependent launch (PDL) primitives for numba.cuda kernels.

PDL takes three pieces; each guarantees something different:

1. the launch attribute, on the DEPENDENT's launch: programmatic stream serialisation
   (cudaLaunchAttributeProgrammaticStreamSerialization; here `cuda.core.LaunchConfig(
   programmatic_stream_serialization=True)` in lab/backend/cuda.py, under LAB_PDL=1). It lets
   the dependent be launched before the kernel ahead of it on the stream has finished; without
   it the stream orders the two as usual and the other two pieces change nothing. It guarantees
   nothing about data.
2. the primary's trigger, `pdl_launch_dependents()` (`griddepcontrol.launch_dependents`, CUDA
   C++ cudaTriggerProgrammaticLaunchCompletion): once every block of the primary has triggered
   (or exited), the dependent may start launching. A scheduling hint only: it neither means the
   primary has finished nor makes its writes visible to the dependent.
   Where it goes is a performance choice, measured: most kernels here trigger right after their
   wait, so the dependent's launch overlaps their whole run. The split-K attention partials
   (LATE_TRIGGER) trigger after their partials instead: at long context their grid (n_head,
   splits) fills nearly every SM and runs long, and a dependent launched then can only have
   its blocks placed on the few SMs left free (the likely mechanism: the recording names the
   edge, not the placement). On the H200 at context 900 (splits 32) the early trigger
   made the edge into attn_combine cost 15.1 us per step and PDL lose 5.7 us per step against
   no PDL; with the trigger after the partials PDL saves 10.4 (data/gpu/pdl_context*.json,
   scripts/record_gpu_pdl_context.py). lab/pdl_check.py holds the kernels to it.
3. the dependent's wait, `pdl_wait()` (`griddepcontrol.wait`, cudaGridDependencySynchronize):
   blocks until the grids this one depends on have COMPLETED and their memory is visible. The
   only one of the three that orders data, so every kernel's FIRST statement is `pdl_wait()`
   (lab/pdl_check.py enforces it): a kernel launched early never reads a predecessor's output
   too soon. When the launch is not programmatic the wait returns at once.

How much the dependent overlaps its predecessor is up to the hardware: a gain, never something
correctness may rely on. Dependencies outside one stream's chain (the overlap's side stream)
still need ordinary events. That the step's bytes are the same with LAB_PDL=1 and 0 is checked
(tests/test_pdl.py, on the simulator and on a GPU), not assumed from the wait returning at once
on an ordinary launch.

numba-cuda has no griddepcontrol intrinsics, so they are emitted as inline PTX. Both compile to
nothing below sm_90 (the instructions do not exist there) and are plain no-op Python functions
under numba's CUDA simulator.
"""
from numba import config

# kernels that trigger their dependents after their main work, not right after their wait
# (above, piece 2): the split-K attention partials, whose grid grows with the context.
# (kernels/fused.py's attn_fused_grid does too, in its partial blocks; its tail blocks trigger
# once their wait is over. Two triggers in two branches: the static check below takes one
# trigger at the top level, so it is not listed; tests/test_fusion.py holds it.)
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
