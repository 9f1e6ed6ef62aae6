"""opfuse: operator-fusion optimizer and advisor for ONNX inference models.

import onnx, opfuse
result = opfuse.optimize(onnx.load("model.onnx"))   # verified against the original
print(result.summary())
result.save("model.opt.onnx")
"""

__version__ = "0.1.0"

# imported after __version__ (the modules below read it); `verify` is the function: the
# submodule is sys.modules["opfuse.verify"] (`from opfuse.verify import ...` works)
from opfuse.advisor.advise import AdviseOptions, advise  # noqa: E402
from opfuse.api import OptimizeResult  # noqa: E402
from opfuse.batching import batch  # noqa: E402
from opfuse.errors import EngineError, OpfuseError, VerificationError  # noqa: E402
from opfuse.public import optimize, passes, verify  # noqa: E402
from opfuse.registry import PassInfo  # noqa: E402
from opfuse.rewrite.context import Options  # noqa: E402
from opfuse.session import InferenceSession  # noqa: E402
from opfuse.verify import OutputDiff, VerifyReport  # noqa: E402

__all__ = [
    "AdviseOptions",
    "EngineError",
    "InferenceSession",
    "OpfuseError",
    "OptimizeResult",
    "Options",
    "OutputDiff",
    "PassInfo",
    "VerificationError",
    "VerifyReport",
    "__version__",
    "advise",
    "batch",
    "optimize",
    "passes",
    "verify",
]
