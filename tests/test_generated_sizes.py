"""The sizes of generated inputs: an image's free height and width get a size images have
(224, or the model's metadata), and sizes onnxruntime refuses (a reflect pad longer than
the input, a reshape that does not divide) grow before anything is refused (issue 41)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from helpers import run_command
from opfuse.errors import OpfuseError
from opfuse.verification.compare import compare_files, make_inputs_and_plan, session


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.checker.check_model(model, full_check=True)
    onnx.save_model(model, str(path))
    return path


def relu_model(
    dims: list[object], elem: int = TensorProto.FLOAT, **metadata: str
) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", elem, dims)],
        [helper.make_tensor_value_info("y", elem, dims)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    helper.set_model_props(model, metadata)
    return model


def reflect_pad_model(pad: int = 40) -> onnx.ModelProto:
    """A VAD-like front end: a reflect pad of ``pad`` on each side of a [1, N] signal, which
    onnxruntime refuses on a signal no longer than the pad (silero-vad's, issue 41)."""
    pads = helper.make_tensor("pads", TensorProto.INT64, [4], [0, pad, 0, pad])
    graph = helper.make_graph(
        [
            helper.make_node("Pad", ["x", "pads"], ["p"], mode="reflect"),
            helper.make_node("Relu", ["p"], ["r"]),
            helper.make_node("Identity", ["r"], ["y"]),  # a pass fires: the model changes
        ],
        "vad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "N"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, None])],
        [pads],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def shape_of(path: Path) -> tuple[int, ...]:
    feeds, _ = make_inputs_and_plan(session(path), model=path)
    return feeds["x"].shape


@pytest.mark.parametrize(
    ("dims", "expected"),
    [
        (["N", 3, "H", "W"], (1, 3, 224, 224)),  # NCHW
        (["N", "H", "W", 3], (1, 224, 224, 3)),  # NHWC
        (["N", 1, "H", "W"], (1, 1, 224, 224)),  # grey
        (["N", 3, 48, "W"], (1, 3, 48, 224)),  # a text line: the free width only
        (["N", 5, "H", "W"], (1, 5, 32, 32)),  # not an image: 5 channels
        (["N", "C", "H", "W"], (1, 32, 32, 32)),  # channels unknown
        (["N", 3, 32, 32], (1, 3, 32, 32)),  # nothing free
    ],
)
def test_an_image_inputs_free_height_and_width_get_a_size_images_have(tmp_path, dims, expected):
    assert shape_of(save(relu_model(dims), tmp_path / "m.onnx")) == expected


def test_an_integer_4d_input_is_not_an_image(tmp_path):
    model = relu_model(["N", 3, "H", "W"], TensorProto.INT32)
    model.graph.node[0].op_type = "Abs"
    assert shape_of(save(model, tmp_path / "m.onnx")) == (1, 3, 32, 32)


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({"imgsz": "[640, 640]"}, (640, 640)),  # ultralytics
        ({"image_size": "384"}, (384, 384)),
        ({"input_shape": "1,3,256,192"}, (256, 192)),
    ],
)
def test_the_models_metadata_gives_the_image_size(tmp_path, metadata, expected):
    path = save(relu_model(["N", 3, "H", "W"], **metadata), tmp_path / "m.onnx")
    feeds, plan = make_inputs_and_plan(session(path), model=path)
    assert feeds["x"].shape[2:] == expected
    assert repr(next(iter(metadata))) in plan.how["x"]  # the plan names the key


def test_a_given_size_holds_over_the_image_size(tmp_path):
    path = save(relu_model(["N", 3, "H", "W"]), tmp_path / "m.onnx")
    feeds, _ = make_inputs_and_plan(session(path), {"x": [2, 3, 64, 48]}, model=path)
    assert feeds["x"].shape == (2, 3, 64, 48)


def test_a_refused_reflect_pad_grows_the_free_dims(tmp_path):
    path = save(reflect_pad_model(), tmp_path / "vad.onnx")
    report = compare_files(path, path)
    assert report.ok and report.input_shapes == {"x": [1, 64]}
    assert report.grown == "free dims grown x2: onnxruntime refused x[1,32]"
    assert "pre-pad (40)" in (report.refused or "")
    assert "grown x2" in report.fed.text() and report.to_json()["inputs_generated"] is True


def test_a_reshape_that_does_not_divide_grows_the_free_dims(tmp_path):
    """[1, N] reshaped into rows of 3: 32 and 64 do not divide, 96 does."""
    shape = helper.make_tensor("s", TensorProto.INT64, [2], [-1, 3])
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "N"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["R", 3])],
        [shape],
    )
    path = save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), tmp_path / "m.onnx"
    )
    report = compare_files(path, path)
    assert report.ok and report.input_shapes == {"x": [1, 96]}


def test_nothing_to_grow_raises_the_first_refusal(tmp_path):
    """Fixed dims: the refusal of the first inputs, with its hint."""
    path = save(reflect_pad_model(), tmp_path / "vad.onnx")
    proto = onnx.load(str(path))
    proto.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 16
    fixed = save(proto, tmp_path / "fixed.onnx")
    with pytest.raises(OpfuseError, match=r"inputs x \[1, 16\]: .*pre-pad.*--inputs samples.npz"):
        compare_files(fixed, fixed)


def test_given_sizes_never_grow(tmp_path):
    path = save(reflect_pad_model(), tmp_path / "vad.onnx")
    with pytest.raises(OpfuseError, match=r"inputs x \[1, 20\]"):
        compare_files(path, path, input_shapes={"x": [1, 20]})


def test_optimize_of_a_model_whose_generated_input_fails_a_reflect_pad_exits_0(
    tmp_path, monkeypatch, capsys
):
    """issue 41's acceptance test: `opfuse optimize silero_vad.onnx -o out.onnx` without
    options ended in exit 2 (the generated input of length 32 was shorter than the pad)."""
    path = save(reflect_pad_model(), tmp_path / "vad.onnx")
    out = tmp_path / "out.onnx"
    status, printed, err = run_command(["optimize", path, "-o", out], monkeypatch, capsys)
    assert status == 0, err
    text = " ".join(printed.split())
    assert "verification: ok on inputs x[1,64] (generated, seed 0; free dims grown x2" in text
    assert "pre-pad (40)" in text
    assert out.exists()
    x = np.random.default_rng(0).standard_normal((1, 100)).astype(np.float32)
    assert compare_files(path, out, inputs_npz=_npz(tmp_path, x)).ok


def _npz(tmp_path: Path, x: np.ndarray) -> Path:
    path = tmp_path / "x.npz"
    np.savez(path, x=x)
    return path


def line_reader_model(height: int = 32) -> onnx.ModelProto:
    """A CRNN-like text-line reader: a convolution of ``height`` collapses the free height
    to 1, which Squeeze removes; it runs on heights ``height`` to 2 x ``height`` - 1 only
    (the PP-OCRv4 recognizer runs below 96), never on an image's 224 nor on 224 grown."""
    w = helper.make_tensor(
        "w",
        TensorProto.FLOAT,
        [4, 3, height, 1],
        np.linspace(-1, 1, 12 * height, dtype=np.float32),
    )
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [2])
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], strides=[height, 1]),
            helper.make_node("Squeeze", ["c", "axes"], ["s"]),
            helper.make_node("Transpose", ["s"], ["t"], perm=[0, 2, 1]),
            helper.make_node("Identity", ["t"], ["y"]),  # a pass fires: the model changes
        ],
        "reader",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "W", 4])],
        [w, axes],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_an_image_model_refusing_224_runs_at_a_text_lines_size(tmp_path):
    """The image sizes onnxruntime refuses fall back to a text line's 48x320 (issue 41's
    third-party set: the PP-OCRv4 recognizer passed at 32x32 and failed at 224x224; it
    reads lines of 48x320), then to the free dims' 32."""
    path = save(line_reader_model(), tmp_path / "rec.onnx")
    report = compare_files(path, path)
    assert report.ok and report.input_shapes == {"x": [1, 3, 48, 320]}
    assert report.grown == (
        "image height and width at a text line's 48x320: onnxruntime refused x[1,3,224,224]"
    )
    assert "SqueezeBase" in (report.refused or "")  # onnxruntime's reason is kept
    low = save(line_reader_model(height=24), tmp_path / "low.onnx")  # heights 24 to 47
    report = compare_files(low, low)
    assert report.ok and report.input_shapes == {"x": [1, 3, 32, 32]}
    assert report.grown == "image height and width at 32: onnxruntime refused x[1,3,224,224]"


def test_an_image_model_refusing_224_and_32_still_grows(tmp_path):
    """A reflect pad of 300 on the height and width: 224 and 32 are refused, 448 runs."""
    pads = helper.make_tensor("pads", TensorProto.INT64, [8], [0, 0, 300, 300, 0, 0, 300, 300])
    graph = helper.make_graph(
        [helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, None, None])],
        [pads],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    path = save(model, tmp_path / "pad.onnx")
    report = compare_files(path, path)
    assert report.ok and report.input_shapes == {"x": [1, 3, 448, 448]}
    assert report.grown == "free dims grown x2: onnxruntime refused x[1,3,224,224]"


def test_an_image_model_running_at_224_keeps_it(tmp_path):
    """The fallback is only for refused sizes: a model that runs at 224 is fed 224."""
    path = save(relu_model(["N", 3, "H", "W"]), tmp_path / "m.onnx")
    report = compare_files(path, path)
    assert report.input_shapes == {"x": [1, 3, 224, 224]} and report.grown is None


def test_optimize_of_a_line_reader_refusing_224_exits_0(tmp_path, monkeypatch, capsys):
    """`opfuse optimize rec.onnx -o out.onnx` without options: verified at a text line's
    48x320 and said so; the written model agrees with the original at another line size."""
    path = save(line_reader_model(), tmp_path / "rec.onnx")
    out = tmp_path / "out.onnx"
    status, printed, err = run_command(["optimize", path, "-o", out], monkeypatch, capsys)
    assert status == 0, err
    text = " ".join(printed.split())
    assert (
        "verification: ok on inputs x[1,3,48,320] (generated, seed 0; image height and width "
        "at a text line's 48x320: onnxruntime refused x[1,3,224,224]" in text
    ), text
    x = np.random.default_rng(1).standard_normal((1, 3, 40, 200)).astype(np.float32)
    assert compare_files(path, out, inputs_npz=_npz(tmp_path, x)).ok


def state_model() -> onnx.ModelProto:
    """silero_vad.onnx's interface: an audio input [1, ?] behind a reflect pad of 40, and a
    recurrent state [2, ?, 4] whose unnamed middle dim is the batch (here a Reshape to
    [2, 4] stands for the LSTM that needs it to be 1): growing every free dim never runs."""
    pads = helper.make_tensor("pads", TensorProto.INT64, [4], [0, 40, 0, 40])
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [2, 4])
    graph = helper.make_graph(
        [
            helper.make_node("Pad", ["x", "pads"], ["p"], mode="reflect"),
            helper.make_node("Relu", ["p"], ["r"]),
            helper.make_node("Identity", ["r"], ["y"]),  # a pass fires: the model changes
            helper.make_node("Reshape", ["state", "shape"], ["h"]),
            helper.make_node("Tanh", ["h"], ["new_state"]),
        ],
        "vad",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, ""]),
            helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "", 4]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, None]),
            helper.make_tensor_value_info("new_state", TensorProto.FLOAT, [2, 4]),
        ],
        [pads, shape],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_a_free_middle_dim_at_1_after_growing_fails(tmp_path):
    """Grown alone, the state's middle dim grows with the audio; the last attempts keep it
    at 1 (silero_vad.onnx, issue 41's acceptance model, ended in exit 2 on main)."""
    path = save(state_model(), tmp_path / "vad.onnx")
    report = compare_files(path, path)
    assert report.ok and report.input_shapes == {"x": [1, 64], "state": [2, 1, 4]}
    assert report.grown == (
        "free dims grown x2, middle free dims at 1: onnxruntime refused x[1,32], state[2,32,4]"
    )


def test_a_middle_dim_stays_as_chosen_when_growing_runs(tmp_path):
    """The middle dims keep their 32 where growing alone runs (a reshape dividing 3*32*k)."""
    shape = helper.make_tensor("s", TensorProto.INT64, [2], [-1, 9])
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "M", "N"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["R", 9])],
        [shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    report = compare_files(*(2 * [save(model, tmp_path / "m.onnx")]))
    assert report.ok and report.input_shapes == {"x": [1, 96, 96]}


def test_optimize_of_a_model_with_a_batch_in_its_state_exits_0(tmp_path, monkeypatch, capsys):
    """`opfuse optimize` without options: verified, and the written model agrees with the
    original at the sizes silero-vad runs on (512 samples, a state of batch 1)."""
    path = save(state_model(), tmp_path / "vad.onnx")
    out = tmp_path / "out.onnx"
    status, printed, err = run_command(["optimize", path, "-o", out], monkeypatch, capsys)
    assert status == 0, err
    assert "middle free dims at 1" in " ".join(printed.split())
    rng = np.random.default_rng(2)
    npz = tmp_path / "real.npz"
    np.savez(
        npz, x=rng.standard_normal((1, 512), np.float32), state=np.zeros((2, 1, 4), np.float32)
    )
    assert compare_files(path, out, inputs_npz=npz).ok
