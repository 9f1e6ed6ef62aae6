"""Trial runs of opfuse's passes on a copy of the model: which recommendation a pass would
apply, and the engine's recorded reason when it would not."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import onnx_ir as ir

from opfuse.model import io
from opfuse.pipeline.conductor import OptimizeResult, optimize_model
from opfuse.rewrite.context import Options, PassContext
from opfuse.rewrite.driver import Driver
from opfuse.rewrite.stats import EffectLog
from opfuse.rules import all_passes

AIPP_PASS = "AippFusionPass"


def registered() -> dict[str, str]:
    """Pass name -> section, for every pass this opfuse has."""
    return {p.name: p.section for p in all_passes()}


@dataclass(frozen=True)
class Refusal:
    """A pattern that matched the final graph and gave up: the nodes it covers (its root,
    the nodes it would replace and the layer it would fold into) and the engine's reason."""

    pass_name: str
    section: str
    reason: str
    root: str
    nodes: frozenset[str]


def _node_types(model: ir.Model) -> dict[str, str]:
    return {n.name: n.op_type for n in model.graph if n.name}


@dataclass
class Trial:
    result: OptimizeResult
    node_types: dict[str, str]  # node name -> op type after the run
    options: Options = field(default_factory=Options)
    source: ir.Model | None = None  # a copy of the model the trial started from
    enable: list[str] = field(default_factory=list)
    _without: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def run(cls, model: ir.Model, enable: Iterable[str] = (), target: str | None = None) -> Trial:
        options = Options(target=target)
        enable = list(enable)
        result = optimize_model(io.copy_model(model), enable=enable, options=options)
        return cls(result, _node_types(result.model), options, io.copy_model(model), enable)

    def without(self, pass_name: str) -> dict[str, str]:
        """Node name -> op type after the same run with ``pass_name`` turned off (cached)."""
        if pass_name not in self._without:
            assert self.source is not None
            result = optimize_model(
                io.copy_model(self.source),
                enable=[p for p in self.enable if p != pass_name],
                disable=[pass_name],
                options=self.options,
            )
            self._without[pass_name] = _node_types(result.model)
        return self._without[pass_name]

    def refusals(self) -> list[Refusal]:
        """The refused matches still standing in the optimized main graph, with the nodes
        each covers. At the fixpoint every rule that still matches was refused, so matching
        the rules of the passes that recorded a reason once more (the engine's dry run)
        gives them all (the effect log keeps only the root of a few). Passes that are graph
        functions record only a node: their refusals cover that node alone."""
        known = {p.name: p for p in all_passes()}
        refusing: set[str] = set()
        out: list[Refusal] = []
        for s in self.result.log:
            if not s.reasons:
                continue
            refusing.add(s.pass_name)
            info = known.get(s.pass_name)
            if info is not None and info.rules:
                continue
            for reason, names in s.examples.items():
                out.extend(
                    Refusal(s.pass_name, s.section, reason, n, frozenset([n]))
                    for n in dict.fromkeys(names)
                )
        infos = [
            known[name]
            for name in self.result.passes
            if name in refusing and name in known and known[name].rules
        ]
        if not infos:
            return out
        ctx = PassContext(self.result.model, self.options, EffectLog())
        for e in Driver(ctx, infos).explain():
            if e.reason:
                covered = frozenset(n.name for n in e.nodes if n.name)
                out.append(
                    Refusal(e.info.name, e.info.section, e.reason, e.root.name or "", covered)
                )
        return out

    def pass_summary(self) -> list[dict[str, object]]:
        """Per pass that matched anything: matched/effected and why it did not fire."""
        rows: dict[str, dict[str, object]] = {}
        counts: dict[str, list[int]] = {}  # pass -> [matched, effected]
        reasons: dict[str, list[dict[str, object]]] = {}
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
                    "reasons": reasons.setdefault(s.pass_name, []),
                },
            )
            count_pair = counts.setdefault(s.pass_name, [0, 0])
            count_pair[0] += s.matched
            count_pair[1] += s.effected
            row["matched"], row["effected"] = count_pair
            for reason, count in s.reasons.most_common():
                reasons[s.pass_name].append(
                    {
                        "pattern": s.pattern,
                        "reason": reason,
                        "count": count,
                        # a node refused again after a neighbour changed is listed once
                        "nodes": list(dict.fromkeys(s.examples.get(reason, []))),
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
        if changed and self.result.log.effected(pass_name):
            # the pass applies it when turning it off changes what becomes of these nodes
            # (another pass may have changed them, and this one fired somewhere else)
            without = self.without(pass_name)
            if any(self.node_types.get(n) != without.get(n) for n in nodes):
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
        if changed:
            verdict.update(
                fires=False,
                reason=f"other passes rewrite these nodes ({', '.join(changed[:3])}); "
                f"the result is the same without {pass_name}",
            )
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
