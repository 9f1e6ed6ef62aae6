"""Hardware profiles as data: the group limits, alignment, L2 size and peaks the advisor
uses come from a JSON file (``src/opfuse/targets/NAME.json`` or a user's path)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from opfuse.errors import OpfuseError

LIMIT_KEYS = ("conv_elementwise", "elementwise_chain", "reduce_elementwise", "segment_elementwise")
NUMBER_KEYS = (
    "alignment",
    "l2_bytes",
    "peak_flops",
    "vector_flops",
    "bandwidth_bytes_per_s",
    "dtype_bytes",
    "l2_chain_max_ops",
)


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    alignment: int
    l2_bytes: int
    peak_flops: float  # matrix unit (cube) FLOP/s
    vector_flops: float  # vector unit FLOP/s
    bandwidth_bytes_per_s: float
    dtype_bytes: int
    ub_limits: dict[str, int] = field(default_factory=dict)
    l2_chain_max_ops: int = 8
    source: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "source": self.source,
            "alignment": self.alignment,
            "l2_bytes": self.l2_bytes,
            "peak_flops": self.peak_flops,
            "vector_flops": self.vector_flops,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "ub_limits": dict(self.ub_limits),
        }


def builtin_targets() -> list[str]:
    folder = resources.files("opfuse") / "targets"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def load_target(name_or_path: str) -> Target:
    """A built-in target by name (ascend310, cpu, cuda) or a JSON file of the same shape."""
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        if not path.is_file():
            raise OpfuseError(f"--target {name_or_path}: no such file")
        text, source = path.read_text("utf-8"), str(path)
    else:
        if name_or_path not in builtin_targets():
            raise OpfuseError(
                f"--target {name_or_path!r}: unknown; built-in targets are "
                f"{', '.join(builtin_targets())}, or give a JSON file"
            )
        text = (resources.files("opfuse") / "targets" / f"{name_or_path}.json").read_text("utf-8")
        source = f"builtin:{name_or_path}"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OpfuseError(f"{source}: not valid JSON: {exc}") from None
    missing = [k for k in (*NUMBER_KEYS, "ub_limits") if k not in data]
    if missing:
        raise OpfuseError(f"{source}: target profile lacks {', '.join(missing)}")
    limits = data["ub_limits"]
    bad = [k for k in LIMIT_KEYS if not isinstance(limits.get(k), int) or limits[k] < 0]
    if bad:
        raise OpfuseError(f"{source}: ub_limits needs non-negative integers for {', '.join(bad)}")
    try:
        return Target(
            name=str(data.get("name", path.stem)),
            description=str(data.get("description", "")),
            alignment=int(data["alignment"]),
            l2_bytes=int(data["l2_bytes"]),
            peak_flops=float(data["peak_flops"]),
            vector_flops=float(data["vector_flops"]),
            bandwidth_bytes_per_s=float(data["bandwidth_bytes_per_s"]),
            dtype_bytes=int(data["dtype_bytes"]),
            ub_limits={k: int(limits[k]) for k in LIMIT_KEYS},
            l2_chain_max_ops=int(data["l2_chain_max_ops"]),
            source=source,
        )
    except (TypeError, ValueError) as exc:
        raise OpfuseError(f"{source}: bad value in target profile: {exc}") from None
