"""The step the configuration asks for: one function, `compose_step(cfg, base)`.

`base` is the engine's step (lab/engine/step.py's Step, or an experiment's variant of it). The
mode picks its family (ranks: RankStep; drafting: DraftStep; LAB_PERSISTENT: PersistentStep;
LAB_FUSION: FusedStep; else Step), a variant of another family is refused, saying which family
the mode runs, and the deliberate bugs' overrides (lab/engine/bugs.py) go on top.
"""
from __future__ import annotations

from lab.bugspec import BUGS
from lab.errors import LabError
from .bugs import OVERRIDES, refusals
from .draft import DraftKey, DraftStep
from .persistent import PersistentStep
from .ranks import RankSkewStep, RankStep
from .step import FusedStep, Step


def compose_step(cfg, base: type[Step] = Step) -> type[Step]:
    """The step class for `cfg` (ranks, draft, persistent, fusion, bugs) from `base`."""
    name = base.__name__
    if cfg.ranks > 1:                   # the rank step, or its bug (a rank variant as it is)
        if issubclass(base, RankStep):
            return base
        if base is not Step:
            raise LabError(f"step={name} is a variant of the one-device step; LAB_RANKS>1 runs "
                           f"the rank step (pass a subclass of lab.engine.ranks.RankStep)")
        return RankSkewStep if "rank_skew" in set(cfg.bugs) else RankStep
    if cfg.draft:                       # the verify step, with LAB_BUG_SPEC_KEY's key (the only
        if base is not Step and not issubclass(base, DraftStep):     # bug drafting allows)
            raise LabError(f"step={name} is a variant of the one-token step; LAB_DRAFT>0 runs "
                           f"the verify step (pass a subclass of DraftStep)")
        base = DraftStep if base is Step else base
        return (type(f"{base.__name__}+spec_key", (DraftKey, base), {})
                if "spec_key" in cfg.bugs else base)
    if cfg.persistent:
        if not (base is Step or issubclass(base, PersistentStep)):
            raise LabError(f"step={name} is not a variant of the persistent step: "
                           f"LAB_PERSISTENT=1 runs PersistentStep (pass a subclass of it)")
        base = PersistentStep if base is Step else base
    elif issubclass(base, PersistentStep):
        raise LabError(f"step={name} is a variant of the persistent step: it needs "
                       f"LAB_PERSISTENT=1")
    elif cfg.fusion and not issubclass(base, FusedStep):
        if base is not Step:
            raise LabError(f"step={name} is a variant of the one-op-per-kernel step; "
                           f"LAB_FUSION=1 runs the fused step (pass a subclass of FusedStep)")
        base = FusedStep
    # a bug that overrides a piece `base` does not have would silently do nothing there
    why = refusals(cfg.bugs, base)
    if why:
        raise LabError(" ".join(f"{BUGS[n].env}=1 cannot exist in {base.__name__}: {reason}."
                                for n, reason in why.items()))
    if not cfg.fusion and not cfg.persistent and issubclass(base, FusedStep):
        raise LabError(f"step={name} is a variant of the fused step: it needs LAB_FUSION=1")
    chosen = tuple(OVERRIDES[n] for n in BUGS if n in set(cfg.bugs))
    if not chosen:
        return base
    rebuilt = base.rebuilt_each_step or any(c.rebuilt_each_step for c in chosen)
    return type(f"{base.__name__}+" + "+".join(sorted(cfg.bugs)), (*chosen, base),
                {"rebuilt_each_step": rebuilt})
