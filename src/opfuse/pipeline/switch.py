"""The fusion switch file, in Huawei CANN's JSON format and with its semantics.

    {"Switch": {"GraphFusion": {"ALL": "off", "SoftmaxFusionPass": "on"},
                "UBFusion":    {"ALL": "on"}}}

Everything is on by default (a pass's own default otherwise); ``ALL`` sets every
switchable pass of its section; a named pass overrides ``ALL`` whatever the order; values
are exactly "on" or "off". A mandatory pass turned off stays on with a warning. A real CANN
pass with no ONNX counterpart gets a warning; any other unknown name is an error.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from opfuse.errors import OpfuseError
from opfuse.pipeline.suggest import closest
from opfuse.rewrite.registry import PassInfo

SECTIONS = ("GraphFusion", "UBFusion")
SwitchTable = dict[str, dict[str, bool]]


def cann_only_names() -> frozenset[str]:
    text = resources.files("opfuse").joinpath("data/cann_passes.txt").read_text("utf-8")
    return frozenset(
        line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")
    )


def parse_switch_file(path: str | os.PathLike[str]) -> SwitchTable:
    p = Path(path)
    try:
        text = p.read_text("utf-8")
    except OSError as exc:
        raise OpfuseError(f"{p}: cannot read switch file: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise OpfuseError(f"{p}: switch file is not UTF-8 text") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OpfuseError(
            f"{p}: switch file is not JSON (line {exc.lineno} column {exc.colno}: {exc.msg})"
        ) from None
    return parse_switch_data(data, where=str(p))


def parse_switch_data(data: object, where: str = "switch file") -> SwitchTable:
    if not isinstance(data, dict) or not isinstance(data.get("Switch"), dict):
        raise OpfuseError(f'{where}: expected an object {{"Switch": {{"GraphFusion": {{...}}}}}}')
    extra = set(data) - {"Switch"}
    if extra:
        raise OpfuseError(f"{where}: unknown top-level key {sorted(extra)[0]!r}; only 'Switch'")
    table: SwitchTable = {}
    for section, entries in data["Switch"].items():
        if section not in SECTIONS:
            raise OpfuseError(
                f"{where}: unknown section {section!r}; expected one of {', '.join(SECTIONS)}"
            )
        if not isinstance(entries, dict):
            raise OpfuseError(f"{where}: section {section} must be an object of name: on|off")
        table[section] = {}
        for name, value in entries.items():
            if value not in ("on", "off"):
                raise OpfuseError(
                    f'{where}: {section}.{name} is {json.dumps(value)}; must be "on" or "off"'
                )
            table[section][name] = value == "on"
    return table


@dataclass
class SwitchResult:
    enabled: list[PassInfo]
    warnings: list[str] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.enabled]


def _unknown(name: str, known: Iterable[str], where: str) -> OpfuseError:
    close = closest(name, known)
    hint = f"; did you mean {close}?" if close else "; see `opfuse passes`"
    return OpfuseError(f"{where}: unknown pass {name!r}{hint}")


def resolve(
    passes: list[PassInfo],
    table: Mapping[str, Mapping[str, bool]] | None = None,
    enable: Iterable[str] = (),
    disable: Iterable[str] = (),
    where: str = "switch file",
) -> SwitchResult:
    """Decide which passes run, in registry order."""
    by_name = {p.name: p for p in passes}
    cann = cann_only_names()
    warnings: list[str] = []
    state = {p.name: p.default for p in passes}
    for section, entries in (table or {}).items():
        if "ALL" in entries:
            for p in passes:
                if p.section == section:
                    state[p.name] = entries["ALL"]
        for name, on in entries.items():
            if name == "ALL":
                continue
            if name in by_name:
                if by_name[name].section != section:
                    warnings.append(
                        f"{where}: {name} is a {by_name[name].section} pass, listed under {section}"
                    )
                state[name] = on
            elif name in cann:
                warnings.append(f"{where}: {name} is a CANN pass with no ONNX counterpart; ignored")
            else:
                raise _unknown(name, by_name, where)
    for names, on, flag in ((enable, True, "--enable"), (disable, False, "--disable")):
        for name in names:
            if name not in by_name:
                raise _unknown(name, by_name, flag)
            state[name] = on
    for p in passes:
        if p.mandatory and not state[p.name]:
            warnings.append(f"{p.name} is mandatory and stays on")
            state[p.name] = True
    return SwitchResult([p for p in passes if state[p.name]], warnings)
