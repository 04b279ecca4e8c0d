"""Self-check exercises, as the student reads them: for each, a stub that returns None
(`# FILL ME IN`) whose docstring is the statement. Fill them in in a file of your own
(`decode-lab selfcheck --solutions FILE` checks it) or in notebook 08; checkers.py checks them
against the lab's own code on the simulator.

  merge_partials                            the split-K softmax merge
  launches_per_token, per_launch_budget_us  the launch bill: launches/token, the us each may cost
  paired_t                                  paired difference: mean, sem, t
  verdict (VERDICTS)                        what a capture would freeze
  replays_needed                            replays that expose a frozen bug
"""
from __future__ import annotations


# ================================================================ 1. the split-K merge

def merge_partials(part_o, part_ml):
    """Merge split-K attention partials into the attention output o.

    part_o  [n_head, splits, hd]  float32: slice s of head h, sum_t exp(score_t - m_s) * v_t
    part_ml [n_head, splits, 2]   float32: (m_s, l_s) = (max score in the slice,
                                           sum_t exp(score_t - m_s))
    returns o [n_head * hd]: per head h,
        M = max_s m_s,  L = sum_s l_s * exp(m_s - M),
        o[h*hd:(h+1)*hd] = sum_s part_o[h, s] * exp(m_s - M) / L
    An empty slice (splits > context length) has m_s = -inf, l_s = 0, part_o = 0 and must weigh
    nothing. Slice 0 is never empty.
    """
    # FILL ME IN
    return None


# ================================================================ 2. the launch bill

def launches_per_token(kernels_per_layer, layers, other, ranks=1):
    """Kernel launches per decoded token, counted over every rank.

    kernels_per_layer  launches issued by one transformer layer on one rank
    layers             layers in the stack
    other              launches outside the layer stack on one rank (embedding, final norm,
                       head, sampling...)
    ranks              tensor-parallel ranks, one GPU each: every rank issues the whole step,
                       its share of each layer and its own launches outside the stack
    """
    # FILL ME IN
    return None


def per_launch_budget_us(ms_per_token, launches):
    """The time each launch may take, in MICROseconds, when a token takes `ms_per_token`
    MILLIseconds and issues `launches` launches."""
    # FILL ME IN
    return None


# ================================================================ 3. the paired t

def paired_t(a, b):
    """Paired difference d = b - a over reps (a[i] and b[i] are rep i of arms A and B).

    returns (mean_diff, sem, t): mean of d, its standard error (SAMPLE sd of d, ddof = 1,
    divided by sqrt(n)), and t = mean_diff / sem. When every difference is identical (sem = 0):
    t = 0.0 if mean_diff == 0, else +inf or -inf with the sign of mean_diff.
    """
    # FILL ME IN
    return None


# ================================================================ 4. the audit verdict

VERDICTS = ("fine", "promote to device memory", "capture key", "unhandled capture key")


def verdict(kind, values_by_step, plan_keys_by_step):
    """Classify a host-computed value that reaches a launch, as lab/measure/audit.py does.

    kind               "pointer", "by value", "host write" (an upload between steps),
                       "grid", "block" or "kernel"
    values_by_step     {position: the value at that step}
    plan_keys_by_step  {position: the step's plan key (decode_plan(position).key)}
    returns one of
      "fine"                      the same value at every step (nothing for a capture to freeze)
      "promote to device memory"  a pointer or by-value argument that changes between steps,
                                  or any host write (a replay never re-runs it)
      "capture key"               grid / block / kernel that changes, but is constant within
                                  every plan key (one graph per key handles it)
      "unhandled capture key"     grid / block / kernel that changes within one plan key
    Values compare by their str().
    """
    # FILL ME IN
    return None


# ================================================================ 5. how many replays?

def replays_needed():
    """How many consecutive graph replays should a replay test (lab.measure.replay_check.replay_check) run,
    at the least, to expose a host value frozen at capture (the "frozen" bugs of
    lab/engine/bugs.py)?

    Replay 1 is the step that was captured: its frozen value is still right. A plan change can
    re-capture along the way and make a later replay right again. The checker runs your number
    on every frozen bug, from a prompt that ends mid-plan and from one that ends one token
    before a plan boundary; it must expose each of them. A floor, not a proof: a real test also
    runs many more, across plan boundaries and after a request reset.
    """
    # FILL ME IN
    return None


