"""Which models a batch runs and where their outputs go: files, folders, manifests,
per-model options, the resume key, and the one-line refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
from batch_models import identity_chain

from opfuse.batching.jobs import Job, TaskOptions, check_outdir, collect_jobs
from opfuse.errors import OpfuseError


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for rel in ("zoo/a.onnx", "zoo/deep/b.onnx", "zoo/deep/deeper/c.onnx"):
        identity_chain(tmp_path / rel)
    (tmp_path / "zoo" / "notes.txt").write_text("not a model list, not below a given manifest")
    return tmp_path


def test_a_folder_is_mirrored_below_outdir(tree):
    jobs = collect_jobs([tree / "zoo"], TaskOptions())
    assert [j.relpath for j in jobs] == ["a.onnx", "deep/b.onnx", "deep/deeper/c.onnx"]
    assert all(Path(j.model).is_absolute() and Path(j.model).exists() for j in jobs)
    assert jobs[1].output(tree / "out") == tree / "out" / "deep" / "b.onnx"


def test_a_file_goes_to_outdir_by_its_name_and_a_model_named_twice_runs_once(tree):
    model = tree / "zoo" / "deep" / "b.onnx"
    jobs = collect_jobs([model, model], TaskOptions())
    assert [j.relpath for j in jobs] == ["b.onnx"]


def test_txt_manifest_paths_are_relative_to_it(tree):
    manifest = tree / "zoo" / "list.txt"
    manifest.write_text("# models\ndeep/b.onnx\n\na.onnx\n")
    jobs = collect_jobs([manifest], TaskOptions())
    assert [j.relpath for j in jobs] == ["deep/b.onnx", "a.onnx"]


def test_jsonl_manifest_sets_per_model_options(tree):
    manifest = tree / "zoo" / "list.jsonl"
    manifest.write_text(
        '{"path": "a.onnx", "input_shape": {"x": [2, 3]}, "rtol": 0.01}\n'
        '{"path": "deep/b.onnx", "verify_inputs": "in.npz", "switch_file": "sw.json"}\n'
        '{"path": "deep/deeper/c.onnx"}\n'
    )
    base = TaskOptions(atol=1e-3)
    a, b, c = collect_jobs([manifest], base)
    assert a.options.input_shape == {"x": [2, 3]}
    assert (a.options.rtol, a.options.atol) == (0.01, 1e-3)
    assert b.options.verify_inputs == str(tree / "zoo" / "in.npz")
    assert b.options.switch_file == str(tree / "zoo" / "sw.json")
    assert c.options == base
    assert len({a.options.key(), b.options.key(), c.options.key()}) == 3


def test_the_resume_key_ignores_the_limits_only():
    base = TaskOptions()
    assert TaskOptions(timeout=5, max_memory=1 << 20).key() == base.key()
    assert TaskOptions(rtol=1e-3).key() != base.key()
    assert TaskOptions(advise=True).key() != base.key()
    assert TaskOptions(enable=("ConvBatchNormFusionPass",)).key() != base.key()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "list.jsonl:1: not a JSON object"),
        ('{"model": "a.onnx"}', 'list.jsonl:1: each line needs {"path"'),
        ('{"path": "a.onnx", "speed": 3}', "list.jsonl:1: unknown key 'speed'"),
        ('{"path": "a.onnx", "rtol": "x"}', "list.jsonl:1: rtol must be a float"),
        ('{"path": "a.onnx", "input_shape": {"x": 3}}', "input_shape must map names to dims"),
        ('{"path": "missing.onnx"}', "model "),
    ],
)
def test_bad_manifest_lines_are_one_line_errors(tree, line, message):
    manifest = tree / "zoo" / "list.jsonl"
    manifest.write_text(line + "\n")
    with pytest.raises(OpfuseError) as info:
        collect_jobs([manifest], TaskOptions())
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_inputs_empty_folders_and_shared_outputs_are_refused(tree):
    with pytest.raises(OpfuseError, match="no such file or folder"):
        collect_jobs([tree / "nothing.onnx"], TaskOptions())
    (tree / "empty").mkdir()
    with pytest.raises(OpfuseError, match="folder holds no"):
        collect_jobs([tree / "empty"], TaskOptions())
    identity_chain(tree / "other" / "b.onnx")
    with pytest.raises(OpfuseError, match="would both be written to OUTDIR/b.onnx"):
        collect_jobs([tree / "other" / "b.onnx", tree / "zoo" / "deep"], TaskOptions())


def test_outdir_never_replaces_an_input(tree):
    jobs = collect_jobs([tree / "zoo"], TaskOptions())
    with pytest.raises(OpfuseError, match="over the input model"):
        check_outdir(tree / "zoo", jobs)
    check_outdir(tree / "out", jobs)  # a new folder is fine
    (tree / "file").write_text("")
    with pytest.raises(OpfuseError, match="output folder is a file"):
        check_outdir(tree / "file", [Job(str(tree / "zoo" / "a.onnx"), "a.onnx")])
