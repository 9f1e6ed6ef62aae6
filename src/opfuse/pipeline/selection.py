"""Which passes run: chosen once per optimize run from the switch file's table and
``--enable``/``--disable`` (``pipeline.switch.resolve``), then narrowed per model (the
model's opset, the runtime ``--target`` names) and, by the bisection, by passes turned off."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from opfuse.pipeline.switch import resolve
from opfuse.rewrite.registry import PassInfo
from opfuse.rules import all_passes

CONSTANT_FOLDING = "ConstantFoldingFusionPass"  # its constant_node rule's lifts run at load
COMMON_SUBEXPRESSIONS = "CommonSubexpressionFusionPass"  # on: rewrites share equal constants


@dataclass(frozen=True)
class Selection:
    """The enabled passes in registry order, the switches' warnings, and the names the user
    asked for by name (a pass of those that cannot run on the model's opset is a warning;
    any other is only logged as skipped)."""

    enabled: list[PassInfo]
    warnings: list[str] = field(default_factory=list)
    asked: frozenset[str] = frozenset()

    def named(self, name: str) -> PassInfo | None:
        return next((p for p in self.enabled if p.name == name), None)

    @property
    def lift(self) -> bool:
        """Whether the loader lifts Constant nodes to initializers (constant folding's rule)."""
        return self.named(CONSTANT_FOLDING) is not None

    @property
    def merge(self) -> bool:
        """Whether the loader also merges the equal ones (common subexpressions)."""
        return self.lift and self.named(COMMON_SUBEXPRESSIONS) is not None

    def without(self, names: Collection[str]) -> Selection:
        """These passes off too (the bisection's re-runs; none of them mandatory)."""
        return dataclasses.replace(self, enabled=[p for p in self.enabled if p.name not in names])

    def runnable(
        self, opset: int, target: str | None
    ) -> tuple[list[PassInfo], list[str], list[str]]:
        """The passes that run on a model at ``opset``; the warnings (the switches', then a
        pass asked for that needs another opset) and the passes skipped otherwise."""
        warnings, skipped = list(self.warnings), list[str]()
        runnable: list[PassInfo] = []
        for info in self.enabled:
            if info.section == "UBFusion" and target is None:
                continue  # target-specific fusions run only for a named runtime
            if not info.applies_to_opset(opset):
                why = f"{info.name} skipped: needs opset {info.opset_range}, model has {opset}"
                # a warning only when the user asked for it; --target-opset can raise the opset
                (warnings if info.name in self.asked else skipped).append(why)
                continue
            runnable.append(info)
        return runnable, warnings, skipped


def select(
    switch_table: Mapping[str, Mapping[str, bool]] | None = None,
    enable: Iterable[str] = (),
    disable: Iterable[str] = (),
    where: str = "switch file",
) -> Selection:
    """The passes chosen by the switches; an unknown name is an OpfuseError naming ``where``
    (the switch file) or the option."""
    enable, disable = list(enable), list(disable)
    chosen = resolve(all_passes(), switch_table, enable, disable, where=where)
    asked = set(enable) | {
        name for entries in (switch_table or {}).values() for name, on in entries.items() if on
    }
    return Selection(chosen.enabled, chosen.warnings, frozenset(asked))


def select_passes(
    switch_table: Mapping[str, Mapping[str, bool]] | None = None,
    enable: Iterable[str] = (),
    disable: Iterable[str] = (),
    where: str = "switch file",
) -> tuple[list[PassInfo], list[str]]:
    """``select``'s passes and warnings (the older form)."""
    chosen = select(switch_table, enable, disable, where)
    return chosen.enabled, list(chosen.warnings)
