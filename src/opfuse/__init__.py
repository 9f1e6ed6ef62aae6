"""opfuse: operator-fusion optimizer and advisor for ONNX inference models.

    import onnx, opfuse
    result = opfuse.optimize(onnx.load("model.onnx"))   # verified against the original
    print(result.summary())
    result.save("model.opt.onnx")

The names below load on first use, so that ``import opfuse`` (and the CLI's start) stays
cheap. ``opfuse.verify`` and ``opfuse.passes`` are the API's functions although
submodules of the same names exist (``from opfuse.verify import ...`` reads the module).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from opfuse.advisor.advise import AdviseOptions, advise
    from opfuse.api import OptimizeResult
    from opfuse.batching import batch
    from opfuse.errors import EngineError, OpfuseError, VerificationError
    from opfuse.public import optimize, passes, verify
    from opfuse.registry import PassInfo
    from opfuse.rewrite.context import Options
    from opfuse.session import InferenceSession
    from opfuse.verify import OutputDiff, VerifyReport

_WHERE = {
    "optimize": "opfuse.public",
    "verify": "opfuse.public",
    "passes": "opfuse.public",
    "InferenceSession": "opfuse.session",
    "OptimizeResult": "opfuse.api",
    "Options": "opfuse.rewrite.context",
    "PassInfo": "opfuse.registry",
    "VerifyReport": "opfuse.verify",
    "OutputDiff": "opfuse.verify",
    "advise": "opfuse.advisor.advise",
    "AdviseOptions": "opfuse.advisor.advise",
    "batch": "opfuse.batching",
    "OpfuseError": "opfuse.errors",
    "VerificationError": "opfuse.errors",
    "EngineError": "opfuse.errors",
}
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


def _load(name: str) -> Any:
    return getattr(importlib.import_module(_WHERE[name]), name)


class _Package(types.ModuleType):
    """The package's module type: ``verify`` and ``passes`` always give the functions.
    Importing the submodule of the same name sets the package's attribute to the module;
    the setters ignore that (the module stays in ``sys.modules``)."""

    @property
    def verify(self) -> Any:
        return _load("verify")

    @verify.setter
    def verify(self, module: Any) -> None:
        pass

    @property
    def passes(self) -> Any:
        return _load("passes")

    @passes.setter
    def passes(self, module: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        if name not in _WHERE:
            raise AttributeError(f"module 'opfuse' has no attribute {name!r}")
        value = _load(name)
        setattr(self, name, value)
        return value

    def __dir__(self) -> list[str]:
        return sorted(set(__all__) | set(super().__dir__()))


sys.modules[__name__].__class__ = _Package
