"""The fusion switch file: CANN's format and semantics, and its errors."""

from __future__ import annotations

import json

import pytest

from opfuse.errors import OpfuseError
from opfuse.pipeline.switch import cann_only_names, parse_switch_data, parse_switch_file, resolve
from opfuse.rewrite import Rule
from opfuse.rewrite.registry import PassInfo
from opfuse.rules import all_passes


class _Dummy(Rule):
    name = "dummy"
    roots = ("Relu",)


def _pass(name: str, section="GraphFusion", default=True, mandatory=False) -> PassInfo:
    return PassInfo(
        name, "test pass", section=section, default=default, mandatory=mandatory, rules=(_Dummy(),)
    )


PASSES = [
    _pass("AFusionPass"),
    _pass("BFusionPass"),
    _pass("OffByDefaultFusionPass", default=False),
    _pass("MustFusionPass", mandatory=True),
    _pass("UbOneFusionPass", section="UBFusion"),
]


def enabled(table=None, enable=(), disable=()) -> list[str]:
    return resolve(PASSES, table, enable, disable).names


def test_everything_default_without_a_file():
    assert enabled() == ["AFusionPass", "BFusionPass", "MustFusionPass", "UbOneFusionPass"]


@pytest.mark.parametrize("order", ["all_first", "name_first"])
def test_named_pass_overrides_all_in_either_order(order):
    entries = (
        {"ALL": "off", "BFusionPass": "on"}
        if order == "all_first"
        else {"BFusionPass": "on", "ALL": "off"}
    )
    table = parse_switch_data({"Switch": {"GraphFusion": entries}})
    assert enabled(table) == ["BFusionPass", "MustFusionPass", "UbOneFusionPass"]


def test_all_on_with_one_off_and_all_on_turns_on_default_off_passes():
    table = parse_switch_data({"Switch": {"GraphFusion": {"ALL": "on", "AFusionPass": "off"}}})
    assert enabled(table) == [
        "BFusionPass",
        "OffByDefaultFusionPass",
        "MustFusionPass",
        "UbOneFusionPass",
    ]


def test_all_applies_only_to_its_section():
    table = parse_switch_data({"Switch": {"UBFusion": {"ALL": "off"}}})
    assert "UbOneFusionPass" not in enabled(table)
    assert "AFusionPass" in enabled(table)


def test_mandatory_pass_stays_on_with_a_warning():
    table = parse_switch_data({"Switch": {"GraphFusion": {"ALL": "off"}}})
    result = resolve(PASSES, table)
    assert "MustFusionPass" in result.names
    assert any("MustFusionPass is mandatory" in w for w in result.warnings)


def test_command_line_overrides_the_file():
    table = parse_switch_data({"Switch": {"GraphFusion": {"ALL": "off", "AFusionPass": "on"}}})
    assert enabled(table, enable=["BFusionPass"], disable=["AFusionPass"]) == [
        "BFusionPass",
        "MustFusionPass",
        "UbOneFusionPass",
    ]


def test_real_cann_pass_without_counterpart_is_a_warning():
    assert "ZConcatv2dFusionPass" in cann_only_names()
    table = parse_switch_data(
        {
            "Switch": {
                "GraphFusion": {"ZConcatv2dFusionPass": "on"},
                "UBFusion": {"FusionVirtualOpSetSwitch": "on"},
            }
        }
    )
    result = resolve(PASSES, table)
    assert any("ZConcatv2dFusionPass" in w and "no ONNX counterpart" in w for w in result.warnings)
    assert any("FusionVirtualOpSetSwitch" in w for w in result.warnings)


def test_unknown_pass_is_an_error_suggesting_the_closest_name():
    table = parse_switch_data({"Switch": {"GraphFusion": {"BFusionPas": "on"}}})
    with pytest.raises(OpfuseError, match="unknown pass 'BFusionPas'; did you mean BFusionPass"):
        resolve(PASSES, table)
    with pytest.raises(OpfuseError, match="--disable: unknown pass"):
        resolve(PASSES, None, disable=["NopeFusionPass"])


@pytest.mark.parametrize(
    "data,message",
    [
        ({"Switch": {"GraphFusion": {"AFusionPass": "On"}}}, 'must be "on" or "off"'),
        ({"Switch": {"GraphFusion": {"AFusionPass": 1}}}, 'must be "on" or "off"'),
        ({"Switch": {"GraphFusion": {"AFusionPass": True}}}, 'must be "on" or "off"'),
        ({"Switch": {"Graph": {"AFusionPass": "on"}}}, "unknown section 'Graph'"),
        ({"switch": {}}, "expected an object"),
        ([1, 2], "expected an object"),
        ({"Switch": {"GraphFusion": ["AFusionPass"]}}, "must be an object"),
    ],
)
def test_bad_switch_data(data, message):
    with pytest.raises(OpfuseError, match=message):
        parse_switch_data(data)


def test_switch_file_that_is_not_json_names_file_and_line(tmp_path):
    path = tmp_path / "fusion_switch.cfg"
    path.write_text('{"Switch": {"GraphFusion": {"A": "on",}}}')
    with pytest.raises(OpfuseError, match=r"fusion_switch.cfg: switch file is not JSON \(line 1"):
        parse_switch_file(path)


def test_the_seed_examples_parse(tmp_path):
    """The switch files of CANN's documentation (seed 003) are accepted as they are."""
    path = tmp_path / "fusion_switch.cfg"
    path.write_text(
        json.dumps(
            {
                "Switch": {
                    "GraphFusion": {"ALL": "off", "SoftmaxFusionPass": "on"},
                    "UBFusion": {"ALL": "off", "FusionVirtualOpSetSwitch": "on"},
                }
            }
        )
    )
    table = parse_switch_file(path)
    names = {p.name for p in all_passes()}
    if "SoftmaxFusionPass" in names:
        chosen = resolve(all_passes(), table)
        assert "SoftmaxFusionPass" in chosen.names
    assert table["GraphFusion"]["ALL"] is False


def test_every_registered_pass_is_named_like_cann():
    for info in all_passes():
        assert info.name.endswith("FusionPass") and info.name[0].isupper()
        assert info.section in ("GraphFusion", "UBFusion")
        assert info.description
        assert info.name not in cann_only_names(), f"{info.name} is also listed as CANN-only"
