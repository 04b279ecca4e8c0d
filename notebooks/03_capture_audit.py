# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 — What a capture freezes
#
# A CUDA graph records each launch with its arguments **by value**: pointers, sizes, loop
# bounds, grid and block dimensions, and the kernel itself. A replay reuses those values until
# the graph's node parameters are updated; the memory a pointer points to stays live. So
# anything the host computes *per token* and passes to a launch keeps its capture-time value
# in every replay of a graph nobody updates — and nothing in this lab updates a node between
# two tokens of one plan.
#
# The **capture audit** finds those values before they bite: it runs eager steps at different
# positions and tokens and lists every host-computed value that reaches a launch and differs
# between steps. Each gets a verdict:
#
# - **promote to device memory** — pointers (buffer + offset), by-value sizes and loop bounds,
#   host writes before a step: the kernel must read them from device memory at run time (or,
#   on a GPU, the host would have to update the graph's nodes before every launch);
# - **capture key** — grid and block dimensions, kernel choice: legitimate per-plan decisions,
#   *handled* when they are constant within each `decode_plan` key. By default this engine
#   recaptures at a plan change (one graph per key); updating the instantiated graph's kernel
#   nodes (`cudaGraphExecKernelNodeSetParams`, `cudaGraphExecUpdate`) or a conditional node
#   are the other ways to follow them (notebook 11).

# %%
from lab import DecodeEngine, LabConfig, load_model
from lab.bugspec import BUGS
from lab.measure.report import wrapped
from lab.measure.audit import KIND_NOTES, audit, detect_lazy_init

model = load_model()
cfg = LabConfig()


def show(text):
    print(wrapped(text))


report = audit(DecodeEngine(model, cfg))
show(report.summary())

# %% [markdown]
# The clean engine: the only values that change between steps are the attention grids, and
# they change exactly at plan boundaries — the capture key handles them.
#
# ## Three frozen-value bugs, and what the audit says
# Each deliberate bug (`lab/engine/bugs.py`, one `LAB_BUG_*` switch each) smuggles a per-token host
# value into a launch.

# %%
for name in ("frozen_kv_row", "ctx_by_value", "pos_outside_graph"):
    bug = BUGS[name]
    rep = audit(DecodeEngine(model, cfg.replace(bugs={name})))
    print(f"{bug.env}: {bug.what}")
    for v in rep.unhandled[:3]:
        r = v.row()
        show(f"   flagged: launch #{r['launch']} {r['kernel']}.{r['value']} ({r['kind']}), "
             f"{r['distinct']} distinct values, e.g. {r['sample']}")
    show(f"   -> {rep.unhandled[0].verdict}; fix: {bug.fix}\n")

# %% [markdown]
# ## Lazy initialisation: the other way a capture breaks
# Code that initialises on first use (uploads a table, allocates scratch, compiles a kernel)
# works eagerly; inside a capture it depends on *which* operation it is. A synchronous copy is
# not capturable. An allocation is not capturable when it makes a pool grow through a
# synchronous allocator (`cudaMalloc`), as this lab's allocator does; a stream-ordered
# allocation (`cudaMallocAsync`) is, and becomes a graph memory node. Loading a compiled
# kernel's module is not a stream operation: newer drivers allow one inside a capture, older
# drivers may refuse it, and it is slow anywhere — warm up. The **lazy-init detector** captures from a fresh engine
# with warm-up skipped, one capture per plan key, and reports each initialisation that fired
# inside a capture: what kind it was (and so whether it is legal there), where (caller site),
# for which launch, and where the error *showed*. In CUDA an illegal call inside a capture
# fails at once, with `cudaErrorStreamCaptureUnsupported`, and invalidates the capture; code
# that swallows that failure sees nothing more until `end_capture` fails
# (`cudaErrorStreamCaptureInvalidated`). That is not a *sticky* error — CUDA's sticky errors
# (an illegal address in a kernel, say) corrupt the context; after a failed capture the stream
# and the context stay usable, which is what lets the engine fall back to eager. The lecture
# (§3) uses the word more loosely: "CUDA errors are sticky, so the failure was attributed to
# whatever ran next" means an error that *surfaces at a later call* (`cudaGetLastError` after
# the next launch), not one that poisons the context. Both senses meet below: the fault in the
# next section is sticky in CUDA's sense *and* surfaces at a later call.

# %%
show(detect_lazy_init(model, cfg).summary().split("\n")[0])
print("(compilation inside a capture: a module load, allowed by newer drivers, older drivers "
      "may refuse it;\n warm-up moves it out of captures and timed regions)\n")
for name in ("lazy_table", "lazy_scratch", "raw_array"):
    rep = detect_lazy_init(model, cfg.replace(bugs={name}))
    f = rep.illegal[0]
    print(f"{BUGS[name].env}:")
    show(f"   {f.kind} of {f.detail} at {f.site}, needed by launch {f.launch_index} ({f.kernel});")
    show(f"   kind: {KIND_NOTES[f.kind]}")
    show(f"   error showed at: {f.surfaced_at}; plan keys hit: "
         f"{len({g.plan_key for g in rep.illegal})}")
    show(f"   fix: {BUGS[name].fix}\n")

# %% [markdown]
# Each bug fails a capture for its own kind of operation, and the detector says which. Each
# fires just before the launch that needs it; where the error *shows* differs. The table
# upload's failure is caught and only noted by its caller, so the capture error shows at
# `end_capture`. The scratch allocation fails at once, at each plan boundary — every plan key
# after the first, as the scratch grows; allocated once at start-up for the largest plan (the
# clean engine), or stream-ordered, it would not break a capture. (On a GPU a caching allocator
# can hide it: CuPy's pool serves a request from a block it already holds without calling
# `cudaMalloc`, and the capture then succeeds. The detector flags the allocation either way.) The raw array's
# synchronisation fails at its own launch, in every plan key.
#
# The lecture's §3 tells of an error blamed on the *next* launch. That is what an asynchronous
# error does (a kernel's fault reported by a later call); the capture errors above show at the
# offending call or at `end_capture`, never at an unrelated later launch. The next section
# produces one.
#
# ## An error blamed on a later call
# `LAB_BUG_FLOAT_IDS` hands the sampler the int32 token buffer viewed as float32: it stores id
# 40 as 40.0f, and the next step's embedding reads those bits as an id near 1.1e9 and faults far
# outside its table. Kernels run asynchronously, so nothing fails at either launch: the fault is
# reported by the first later call that waits for the device, and from then on every call on
# that device fails (a *sticky* error, in CUDA's sense: the context is unusable). Where does the
# error show?

# %%
import traceback

from lab.errors import DeviceFault


def where_it_shows(c):
    eng = DecodeEngine(model, c)
    try:
        eng.generate("ROMEO.\n", 20)
    except DeviceFault as exc:
        # the engine's calls that were on the stack, innermost first (the backend's own left out)
        frames = [f"{f.name}()" for f in traceback.extract_tb(exc.__traceback__)
                  if "backend" not in f.filename]
        show(f"DeviceFault: {exc}")
        show(f"reported in: {' <- '.join(reversed(frames[-4:]))}")
    return eng


# on the simulator: on a GPU the fault would leave this process's device unusable for every
# later cell (tests/engine/test_bug_float_ids.py runs it on a GPU, one process per run)
faulty = cfg.replace(backend="sim", graph=False, bugs={"float_ids"})
eng = where_it_shows(faulty)

# %% [markdown]
# The report comes from `decode()`'s closing clock read (a synchronize), after every launch of
# every step: neither the kernel that wrote the bad id nor the one that faulted is named. Rerun with `LAB_LAUNCH_BLOCKING=1` (as `CUDA_LAUNCH_BLOCKING=1` on a GPU): every launch
# waits for its kernel, so the launch of the kernel that faulted reports it. Then read the
# launch log for who wrote that kernel's input.

# %%
eng = where_it_shows(faulty.replace(launch_blocking=True))
step = eng.log.step
faulted = [r for r in eng.log.records if r.step == step]
before = [r for r in eng.log.records if r.step == step - 1]
print(f"step {step}: the last launch, the one that faulted: {faulted[-1].kernel}")
print(f"step {step - 1} ended with: {', '.join(r.kernel for r in before[-3:])}")

# %% [markdown]
# `embed` faulted reading `wte[tokens[pos]]`; the kernel that wrote `tokens[pos]` is the step
# before's sampler, and its name says what is wrong with it: `argmax_next_float`, handed the
# token buffer as float32. The fix is the bug's: pass every buffer with the dtype it was
# allocated with. Three things to keep: an asynchronous error names the call that *noticed* it;
# a blocking run (or `compute-sanitizer` on a GPU) moves the report to the launch at fault; and
# the faulting kernel is often only the victim of an earlier writer.
#
# ## What you should now be able to do
# - List every host-computed value that reaches a launch (pointers, sizes, loop bounds, grids,
#   kernel choice) and say for each whether it must be promoted to device memory or can be a
#   capture key — and recognise the three frozen-value bugs from the audit's rows.
# - Read the lazy-init detector: name the kind of operation that fired inside a capture,
#   whether CUDA allows it there, where it was called from, and where its error showed.
# - Explain why a failed capture (`cudaErrorStreamCaptureUnsupported`, then
#   `cudaErrorStreamCaptureInvalidated` at `end_capture`) leaves the context usable, why
#   that is not what CUDA calls "sticky", and what the lecture means by the word (an error that
#   surfaces at a later call).
# - Pre-warm lazy initialisation at start-up instead of relying on the driver to allow it.
# - Find the kernel behind an asynchronous fault reported by a later call: rerun with launches
#   blocking, then follow the faulting kernel's input back to its writer in the launch log.
