"""Trial runs of opfuse's passes on a copy of the model: which recommendation a pass would
apply, and the engine's recorded reason when it would not."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import onnx_ir as ir

from opfuse.api import OptimizeResult, optimize_model
from opfuse.registry import all_passes
from opfuse.rewrite.context import Options

AIPP_PASS = "AippFusionPass"


def copy_model(model: ir.Model) -> ir.Model:
    return ir.from_proto(ir.to_proto(model))


def registered() -> dict[str, str]:
    """Pass name -> section, for every pass this opfuse has."""
    return {p.name: p.section for p in all_passes()}


@dataclass
class Trial:
    result: OptimizeResult
    node_types: dict[str, str]  # node name -> op type after the run

    @classmethod
    def run(cls, model: ir.Model, enable: Iterable[str] = (), target: str | None = None) -> Trial:
        result = optimize_model(
            copy_model(model), enable=list(enable), options=Options(target=target)
        )
        types = {n.name: n.op_type for n in result.model.graph if n.name}
        return cls(result, types)

    def pass_summary(self) -> list[dict[str, object]]:
        """Per pass that matched anything: matched/effected and why it did not fire."""
        rows: dict[str, dict[str, object]] = {}
        for s in self.result.log:
            if not s.matched and not s.effected and not s.reasons:
                continue
            row = rows.setdefault(
                s.pass_name,
                {
                    "pass": s.pass_name,
                    "section": s.section,
                    "matched": 0,
                    "effected": 0,
                    "reasons": [],
                },
            )
            row["matched"] = int(row["matched"]) + s.matched  # type: ignore[call-overload]
            row["effected"] = int(row["effected"]) + s.effected  # type: ignore[call-overload]
            for reason, count in s.reasons.most_common():
                row["reasons"].append(  # type: ignore[attr-defined]
                    {
                        "pattern": s.pattern,
                        "reason": reason,
                        "count": count,
                        "nodes": s.examples.get(reason, []),
                    }
                )
        return list(rows.values())

    def verdict(
        self, pass_name: str, nodes: list[str], original_types: dict[str, str]
    ) -> dict[str, object]:
        """Would ``pass_name`` apply to these (original) nodes? With the engine's reason."""
        known = registered()
        if pass_name not in known:
            return {
                "pass": pass_name,
                "available": False,
                "fires": None,
                "reason": f"{pass_name} is not registered in this opfuse",
            }
        verdict: dict[str, object] = {"pass": pass_name, "available": True}
        if pass_name not in self.result.passes:
            skipped = [w for w in self.result.warnings if w.startswith(pass_name)]
            verdict.update(
                fires=False, reason=skipped[0] if skipped else f"{pass_name} did not run"
            )
            return verdict
        changed = [n for n in nodes if self.node_types.get(n) != original_types.get(n)]
        effected = self.result.log.effected(pass_name)
        if changed and effected:
            verdict.update(fires=True, reason=None)
            return verdict
        wanted = set(nodes)
        for s in self.result.log:
            if s.pass_name != pass_name:
                continue
            for reason, _ in s.reasons.most_common():
                if wanted & set(s.examples.get(reason, [])):
                    verdict.update(fires=False, reason=reason)
                    return verdict
        first_reason = next(
            (r for s in self.result.log if s.pass_name == pass_name for r in s.reasons), None
        )
        verdict.update(
            fires=False,
            reason=f"{first_reason} (recorded on other nodes; these were not listed)"
            if first_reason
            else f"no pattern of {pass_name} matched these nodes",
        )
        return verdict
