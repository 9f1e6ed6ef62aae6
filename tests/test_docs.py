"""docs/PASSES.md is generated from the registry and must stay equal to it."""

from __future__ import annotations

from pathlib import Path

from opfuse.rewrite.registry import markdown_table
from opfuse.rules import all_passes

DOC = Path(__file__).resolve().parents[1] / "docs" / "PASSES.md"


def test_pass_table_is_up_to_date():
    expected = markdown_table(all_passes())
    assert DOC.read_text("utf-8") == expected, (
        "docs/PASSES.md is stale: run `opfuse passes --format markdown > docs/PASSES.md`"
    )


def test_off_by_default_passes_say_why():
    for info in all_passes():
        if not info.default:
            assert info.note, f"{info.name} is off by default without a note saying why"


README = DOC.parents[1] / "README.md"


def test_readme_python_blocks_run(tmp_path, monkeypatch, capsys):
    """Every ```python block of the README runs as written (in a scratch folder)."""
    import re

    blocks = re.findall(r"```python\n(.*?)```", README.read_text("utf-8"), flags=re.S)
    assert blocks, "the README has no Python example"
    monkeypatch.chdir(tmp_path)
    for code in blocks:
        exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})
    printed = capsys.readouterr().out
    assert "ModelProto <OptimizeResult ModelProto: nodes 15 -> 10" in printed
    assert "of its bound" in printed and "input ['IdentityRemovalFusionPass'" in printed


def test_writing_a_rule_quotes_the_files_it_names():
    """Each ```python block of a section of docs/WRITING_A_RULE.md that names a file is
    that file's own text, so the worked example stays the code that ships and is tested."""
    import re

    root = DOC.parents[1]
    text = (root / "docs" / "WRITING_A_RULE.md").read_text("utf-8")
    quoted = 0
    for section in text.split("\n## "):
        blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
        path = re.search(r"`((?:src|tests)/[\w/]+\.py)`", section)
        if path is None or not blocks:
            continue
        source = (root / path.group(1)).read_text("utf-8")
        for block in blocks:
            assert block in source, f"a block of WRITING_A_RULE.md is not in {path.group(1)}"
            quoted += 1
    assert quoted >= 3
