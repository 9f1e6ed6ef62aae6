"""Every pass module; importing one registers its passes. The order here is the order
passes run in (CANN prints its effect log in execution order too)."""

from opfuse.passes import (
    batchnorm,  # noqa: F401
    cleanup,  # noqa: F401
    dead_code,  # noqa: F401  (last, mandatory)
    replace,  # noqa: F401
    softmax,  # noqa: F401
    strip_unused,  # noqa: F401  (first: later passes see only what is kept)
)
