"""The experiments `decode-lab record` runs: importing this package registers each one
(lab/measure/registry.py). One line per module; each module's docstring says what it records."""
from . import costs  # noqa: F401
from . import decode  # noqa: F401
from . import bugs  # noqa: F401
from . import overlap  # noqa: F401
from . import tails  # noqa: F401
from . import benchmarks  # noqa: F401
from . import instances  # noqa: F401
from . import precision  # noqa: F401
from . import barrier  # noqa: F401
from . import handoff  # noqa: F401
from . import megakernel_bound  # noqa: F401
from . import checks  # noqa: F401
from . import persistent  # noqa: F401
from . import plan_switch  # noqa: F401
from . import device_loop  # noqa: F401
from . import speculative  # noqa: F401
from . import pdl_context  # noqa: F401
from . import compare_arms  # noqa: F401
from . import peer  # noqa: F401
from . import sanitize_loop  # noqa: F401
from . import ranks  # noqa: F401
