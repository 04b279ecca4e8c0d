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
# # 13 — Hands on: make the decode step graph-resident yourself
#
# The lecture's lab is a checklist of ten steps. Here you write the code of each step, and a
# checker proves it: it runs your code **in the real engine** (the CPU simulator here; on a GPU
# pass `backend="cuda"` with your solution in a file), against the lab's own tools -- the launch
# log, the capture audit, the ledger, the replay check, the benchmark -- and prints one line:
# `PASS`, or `not yet` and what is wrong.
#
# Each exercise below is a spec (`show(...)` prints it), a stub cell you edit (`# FILL ME IN`),
# and a check cell. Executed as shipped, every stub FAILS, with a message that says what is
# missing: that is what you see first. Fill in a stub, re-run its cell and its check.
#
# Each check runs in a child process with a time limit and a scratch folder of its own: an
# endless loop, an exception or a write outside that folder gets a one-line verdict, and
# nothing your code does reaches this notebook's state. The same checks run from a terminal:
# `decode-lab exercise list`, `decode-lab exercise show NAME`,
# `decode-lab exercise check NAME --solution my_file.py`.

# %%
from lab.teach import handson
from lab.teach.handson import EXERCISES, show


def check(name, solution, backend="sim"):
    """The exercise's check, its verdict wrapped to this page (the command line prints one line).
    backend="cuda" runs it on the GPU, in a fresh process: give the solution as a .py file."""
    return handson.check(name, solution, backend=backend, width=100)

# %% [markdown]
# ## Step 1. Count your launches (lecture: Overview)
# Exercise `launch_count`: count one token's launches; does capture pay?

# %%
show("launch_count", stub=False)

# %%
def launches_per_token(engine):
    """Kernel launches one decoded token issues on `engine`."""
    # FILL ME IN
    return None


def capture_pays(ms_per_token, launches):
    """True when ms_per_token / launches is under 10 microseconds."""
    # FILL ME IN
    return None

# %%
result = check("launch_count", globals())

# %% [markdown]
# ## Step 2. Audit host-computed values (§2)
# Exercise `audit`: classify each host value that reaches a launch.

# %%
show("audit", stub=False)

# %%
from lab.backend import Buffer


def audit_values(engine, positions):
    """{(launch index, what): verdict} for each host value that changes between positions."""
    findings = {}
    # FILL ME IN
    return findings

# %%
result = check("audit", globals())

# %% [markdown]
# ## Step 3. Find the state update: the position advance on the device (§2)
# Exercise `advance`: a device-side position advance that the graph replays.

# %%
show("advance", stub=False)

# %%
import numpy as np
from numba import cuda

from lab import Step, launch
from lab.teach.handson import kernel


def advance_twin(grid, block, pos):
    """pos: int32[1] in device memory. The step's last kernel: one token further."""
    # FILL ME IN
    pass


@kernel("void(int32[::1])", twin=advance_twin, reads=(0,), writes=(0,))
def advance_kernel(pos):
    # FILL ME IN (numba.cuda: cuda.threadIdx.x, cuda.blockIdx.x)
    pass


class AdvanceStep(Step):
    def advance(self):
        """The launches that advance the device-resident position (self.dev.buf.pos)."""
        # FILL ME IN: return [launch(advance_kernel, ((1,), (1,)), (self.dev.buf.pos,))]
        return []

# %%
result = check("advance", globals())

# %% [markdown]
# ## Step 4. Audit lazy initialisation: pre-warm it (§3)
# Exercise `prewarm`: pre-warm the lazy table and scratch so every plan captures.

# %%
show("prewarm", stub=False)

# %%
from lab import HostWork
from lab.plan import plan_boundaries


def pre_warm(engine):
    """Run every first-use initialisation of engine's step, outside any capture."""
    # FILL ME IN
    pass

# %%
result = check("prewarm", globals())

# %% [markdown]
# ## Step 5. Capture, and make failure graceful (§3)
# Exercise `fallback`: end a failed capture, discard it, restore, re-issue eagerly.

# %%
show("fallback", stub=False)

# %%
from lab.errors import CaptureError
from lab.ledger import CaptureFailure
from lab.teach.handson import issue


def capture(engine, plan):
    """The step for `plan` captured: (graph, None), or (None, CaptureFailure(...))."""
    be = engine.backend
    be.begin_capture()
    for item in engine.pieces.items(plan):
        issue(engine, item)
    # FILL ME IN: a failed capture (CaptureError) must not escape
    return be.end_capture(), None

# %%
result = check("fallback", globals())

# %% [markdown]
# ## Step 6. Test with three or more replays (§4)
# Exercise `replay_test`: a repeated-replay test that a frozen pointer fails.

# %%
show("replay_test", stub=False)

# %%
import numpy as np


def replays_match(engine, prompt_ids):
    """True when graph replays decode byte for byte what eager steps decode after the prompt."""
    # FILL ME IN: an eager arm, a graph arm, compared
    return True

# %%
result = check("replay_test", globals())

# %% [markdown]
# ## Step 7. Run the A/A control (§5)
# Exercise `aa_control`: the A/A control before believing a mismatch.

# %%
show("aa_control", stub=False)

# %%
import numpy as np


def ab_verdict(run_a, run_b):
    """"same", "different", or "broken" (A against itself already differs)."""
    # FILL ME IN
    return "same"

# %%
result = check("aa_control", globals())

# %% [markdown]
# ## Step 7, continued. The A/A gate in front of every A/B (§5)
# Exercise `aa_gate`: the A/A gate in front of every A/B: the same control for timings.

# %%
show("aa_gate", stub=False)

# %%
import math

import numpy as np


def aa_gate(run_a, run_a2, reps, critical):
    """True when A and its copy A' agree within their noise and byte for byte."""
    # FILL ME IN
    return True

# %%
result = check("aa_gate", globals())

# %% [markdown]
# ## Step 8. Measure the variance, not just the mean (§1)
# Exercise `variance`: interleaved reps and the standard error of both arms.

# %%
show("variance", stub=False)

# %%
import math

import numpy as np


def measure(arms, reps):
    """{name: (mean ms/token, standard error)} over `reps` interleaved reps per arm."""
    out = {}
    # FILL ME IN
    return out

# %%
result = check("variance", globals())

# %% [markdown]
# ## Step 9. Revisit a rejected optimisation: the fission, under capture (§6)
# Exercise `fission`: split the combine; re-measure the split under capture.

# %%
show("fission", stub=False)

# %%
from kernels import attention, matvec
from lab import Step, launch


class SplitCombine(Step):
    def combine(self, plan, layer, part_o, part_ml):
        """Merge the partials into o, then x += Wo o: two launches."""
        # FILL ME IN
        yield from super().combine(plan, layer, part_o, part_ml)     # still one kernel

# %%
result = check("fission", globals())

# %% [markdown]
# That split does not pay, even captured: the one-kernel combine had no serial tail to remove.
# Exercise `fission_fused`: the case lecture §6 is about -- the fused step's attention
# with the heads tail (`attn_fused`, `LAB_FUSION=1 LAB_ATTN_TAIL=heads`), one launch with a
# serial tail, split into its three phases. It
# must lose eagerly and win captured (notebook 06 shows the same on the H200's recording).

# %%
show("fission_fused", stub=False)

# %%
import numpy as np

from kernels import attention, fused, fused_split
from lab import FusedStep, launch


class SplitAttention(FusedStep):
    def attend(self, plan, layer, part_o, part_ml, scale):
        """attn_fused's three phases as three launches: partials, merge, heads' projection."""
        # FILL ME IN
        yield from super().attend(plan, layer, part_o, part_ml, scale)    # still one kernel

# %%
result = check("fission_fused", globals())

# %% [markdown]
# ## Step 10. Attribute leave-one-out (§7)
# Exercise `loo`: the leave-one-out table.

# %%
show("loo", stub=False)

# %%
import numpy as np


def leave_one_out(run, factors, reps):
    """{factor: ms/token saved by it with the others on, ..., "all": all off - all on}."""
    table = {}
    # FILL ME IN
    return table

# %%
result = check("loo", globals())

# %% [markdown]
# ## Beyond the checklist: speculative decoding's acceptance (notebook 14)
# Exercise `accept` (listed as step 11: the lecture's case studies 003 and 004) asks for the
# acceptance kernel of speculative decoding and the verify step's piece that launches it. It
# lives in notebook 14, beside the drafter and the verify step it completes; its reference is
# checked with the others below.
#
# ## The reference solutions (the lab's, not yours)
# Each exercise ships a reference solution, and known wrong ones, one per common mistake
# (`EXERCISES[name].wrong`: the tests check that each fails naming its mistake). Here the
# references, loaded from the lab and run through the same checks as your stubs above: every
# one passes. Read one with `print(EXERCISES["advance"].reference)` -- after your own attempt.

# %%
for name, exercise in EXERCISES.items():
    result = check(name, exercise.solutions()["reference"])

# %% [markdown]
# ## What you should now be able to do
# - Count a token's launches and judge from the per-launch budget whether capture pays.
# - Audit every host value that reaches a launch, and say which to promote to device memory and
#   which to make a capture key; write the device-side state update a replay needs.
# - Pre-warm lazy initialisation, and make a failed capture a graceful eager fallback that
#   restores what the lazy code changed.
# - Test a graph with several replays against the eager path, after an A/A control; report both
#   arms' standard errors; re-measure a fission under capture; publish a leave-one-out table.
