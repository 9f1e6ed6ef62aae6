"""Every pass module, in the order its passes run (CANN prints its effect log in execution
order too). To add a module, put its name at its place in PIPELINE_ORDER: the registry
sorts passes by it, so import order (which isort may change) does not matter."""

import importlib

from opfuse.rewrite.passinfo import PassInfo
from opfuse.rewrite.registry import registered

PIPELINE_ORDER = (
    "strip_unused",  # first: later passes see only what is kept
    "cleanup",
    "slices",
    "constant_folding",  # with _shape_arith's rules
    "control_flow",  # constant-condition Ifs, once their conditions are folded
    "arithmetic",
    "replace",
    "softmax",
    "hardswish",
    "layout",  # before the Conv fusions: BN small ops meet their Conv once Transposes are gone
    "aipp",  # first-layer preprocessing into the first Conv, once its Transposes are gone
    "batchnorm",
    "grouped_conv",
    "bn_small_ops",
    "conv_affine",
    "requant",
    "qdq_movement",
    "conv_fc",
    "pad_conv",
    "transformer",
    "conv_concat",
    "cse",  # after the fusions: it also deduplicates the constants they made (no extra round)
    "dead_code",  # last, mandatory
)

for _module in PIPELINE_ORDER:
    importlib.import_module(f"opfuse.rules.{_module}")


def all_passes() -> list[PassInfo]:
    """Every pass in execution order: its module's place in PIPELINE_ORDER, then
    registration order within the module."""
    position = {module: i for i, module in enumerate(PIPELINE_ORDER)}
    entries = registered()
    for info, module in entries:
        if module not in position:
            raise RuntimeError(f"pass {info.name}: module {module} is not in PIPELINE_ORDER")
    ordered = sorted(enumerate(entries), key=lambda ie: (position[ie[1][1]], ie[0]))
    return [info for _, (info, _module) in ordered]


def get_pass(name: str) -> PassInfo:
    """The pass named ``name`` (KeyError when there is none)."""
    for info, _module in registered():
        if info.name == name:
            return info
    raise KeyError(name)
