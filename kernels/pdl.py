"""Programmatic dependent launch (PDL) primitives for numba.cuda kernels.

numba-cuda has no griddepcontrol intrinsics, so they are emitted as inline PTX:

- `pdl_wait()`: `griddepcontrol.wait` -- block until the grids this one depends on have
  completed and their memory is visible. Every kernel's FIRST statement is `pdl_wait()`, so a
  kernel launched early (programmatically) never reads a predecessor's output too soon. When the
  launch is not programmatic the instruction returns at once.
- `pdl_launch_dependents()`: `griddepcontrol.launch_dependents` -- allow the next kernel in the
  stream to start its launch before this one finishes (it still waits in `pdl_wait`).

Both compile to nothing below sm_90 (the instructions do not exist there) and are plain no-op
Python functions under numba's CUDA simulator.
"""
from numba import config

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
