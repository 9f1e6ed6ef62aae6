"""opfuse: operator-fusion optimizer and advisor for ONNX inference models.

    import onnx, opfuse
    result = opfuse.optimize(onnx.load("model.onnx"))   # verified against the original
    print(result.summary())
    result.save("model.opt.onnx")

Every name below is defined in ``opfuse.api`` and re-exported here. They load on first use
(the module ``__getattr__`` below, PEP 562), so that ``import opfuse`` and the command
line's start stay cheap: ``opfuse.api`` imports onnxruntime, the advisor and the tuner.
No submodule shares a name with them. Old module paths (``opfuse.io``, ``opfuse.public``...)
still import for one release, with a DeprecationWarning (``opfuse._compat``).
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from opfuse import _compat

try:
    __version__ = version("opfuse")
except PackageNotFoundError:  # a source tree on sys.path, not installed
    __version__ = "0+unknown"

if TYPE_CHECKING:
    from opfuse.api import (
        AdviceReport,
        AdviseOptions,
        BatchInterrupted,
        BatchProgress,
        BatchRecords,
        BatchRun,
        EngineError,
        GateError,
        InferenceSession,
        OpfuseError,
        OptimizeResult,
        OptimizeSettings,
        Options,
        OutputDiff,
        PassInfo,
        Phases,
        ProfileReport,
        ProfileSettings,
        QuantizeResult,
        QuantizeSettings,
        RuntimeSettings,
        SessionSettings,
        SettingsError,
        TuneResult,
        TuneSettings,
        VerificationError,
        VerifyReport,
        VerifySettings,
        advise,
        batch,
        optimize,
        passes,
        profile,
        quantize,
        tune,
        verify,
    )

__all__ = [
    "AdviceReport",
    "AdviseOptions",
    "BatchInterrupted",
    "BatchProgress",
    "BatchRecords",
    "BatchRun",
    "EngineError",
    "GateError",
    "InferenceSession",
    "OpfuseError",
    "OptimizeResult",
    "OptimizeSettings",
    "Options",
    "OutputDiff",
    "PassInfo",
    "Phases",
    "ProfileReport",
    "ProfileSettings",
    "QuantizeResult",
    "QuantizeSettings",
    "RuntimeSettings",
    "SessionSettings",
    "SettingsError",
    "TuneResult",
    "TuneSettings",
    "VerificationError",
    "VerifyReport",
    "VerifySettings",
    "__version__",
    "advise",
    "batch",
    "optimize",
    "passes",
    "profile",
    "quantize",
    "tune",
    "verify",
]

_compat.install()


def __getattr__(name: str) -> Any:
    """Load ``opfuse.api`` on the first use of one of its public names."""
    if name not in __all__:
        raise AttributeError(f"module 'opfuse' has no attribute {name!r}")
    value = getattr(importlib.import_module("opfuse.api"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(__all__) | set(globals()))
