"""Model loading and saving: input checks, external data, atomic writes.

Loading parses the protobuf once, checks it (checker, opset range, external data that is
missing, short, absolute or escaping the model's folder) and hands it to onnx-ir, whose
external tensors stay memory-mapped. Saving writes into a temporary folder beside the
target and renames into place, so an interrupted save never leaves a partial file.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from opfuse.errors import OpfuseError, first_line
from opfuse.model.constants import LIFTED_KEY, MERGED_KEY, Lifted, lift_constants
from opfuse.model.graphs import DEFAULT_DOMAINS, all_graphs
from opfuse.model.set_aside import META_KEY, SetAside, from_proto, restore
from opfuse.model.set_aside import (
    to_proto as to_proto,  # the set-aside-aware one, for callers of io
)
from opfuse.model.shapes import infer_proto, negative_dims_dynamic
from opfuse.model.value_info import DECLARED_KEY, declared, remember_declared

MIN_OPSET = 7
MAX_OPSET = onnx.defs.onnx_opset_version()
TWO_GB = 2**31


def _iter_tensor_protos(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto of a graph: initializers, Constant attributes, subgraphs."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _iter_tensor_protos(attr.g)
            for g in attr.graphs:
                yield from _iter_tensor_protos(g)


def _check_external_data(proto: onnx.ModelProto, path: Path) -> bool:
    """Validate every external-data reference; return whether the model has any."""
    base = path.parent.resolve()
    found = False
    for tensor in _iter_tensor_protos(proto.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        found = True
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        where = f"{path}: tensor {tensor.name!r}"
        if not location:
            raise OpfuseError(f"{where} has external data without a location")
        if os.path.isabs(location) or Path(location).drive:
            raise OpfuseError(f"{where} has an absolute external data location {location!r}")
        target = (base / location).resolve()
        if target != base and base not in target.parents:
            raise OpfuseError(
                f"{where} has external data location {location!r} outside the model's folder"
            )
        if not target.is_file():
            raise OpfuseError(f"{where}: external data file {location!r} is missing")
        offset = _external_int(info, "offset", where) or 0
        length = _external_int(info, "length", where)
        size = target.stat().st_size
        if offset + (length or 0) > size:
            raise OpfuseError(
                f"{where}: external data file {location!r} is shorter ({size} bytes) "
                f"than declared (offset {offset} + length {length})"
            )
    return found


def _external_int(info: dict[str, str], key: str, where: str) -> int | None:
    """An external data ``offset`` or ``length``: a non-negative integer, or absent."""
    text = info.get(key)
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise OpfuseError(f"{where} has external data {key} {text!r}; expected a byte count")
    return value


def read_proto(path: str | os.PathLike[str]) -> tuple[onnx.ModelProto, bool]:
    """Parse and check a model file; return the proto (weights not loaded) and whether
    it uses external data. Raises OpfuseError with a one-line message on bad input."""
    p = Path(path)
    if not p.exists():
        raise OpfuseError(f"{p}: no such file")
    if not p.is_file():
        raise OpfuseError(f"{p}: not a file")
    if p.stat().st_size == 0:
        raise OpfuseError(f"{p}: empty file, not an ONNX model")
    try:
        data = p.read_bytes()  # parsed and checked from these bytes: no re-serialization
    except OSError as exc:
        raise OpfuseError(f"{p}: cannot read: {exc.strerror or exc}") from None
    try:
        proto = onnx.load_model_from_string(data)
    except (DecodeError, RuntimeError, ValueError, UnicodeDecodeError) as exc:
        first = first_line(exc)
        raise OpfuseError(f"{p}: not an ONNX model or truncated ({first})") from None
    if proto.ir_version <= 0 or not proto.HasField("graph"):
        raise OpfuseError(f"{p}: not an ONNX model (no IR version or no graph)")
    opset = default_opset(proto)  # None: only other domains (ai.onnx.ml): passes through
    if opset is not None and opset > MAX_OPSET:
        raise OpfuseError(
            f"{p}: opset {opset} is not supported (opfuse handles opsets up to {MAX_OPSET}; "
            f"older ones are converted to {MIN_OPSET})"
        )
    external = _check_external_data(proto, p)
    try:
        # the checker reads external data files itself only when given the path
        onnx.checker.check_model(str(p) if external else data)
    except onnx.checker.ValidationError as exc:
        first = first_line(exc)
        raise OpfuseError(f"{p}: fails onnx.checker: {first}") from None
    return proto, external


def default_opset(proto: onnx.ModelProto) -> int | None:
    for entry in proto.opset_import:
        if entry.domain in DEFAULT_DOMAINS:
            return int(entry.version)
    return None


def load_model(
    path: str | os.PathLike[str], *, infer: bool = False, lift: bool = False, merge: bool = False
) -> ir.Model:
    """Load a checked model into onnx-ir; external tensors stay lazy (memory-mapped).

    ``infer``: run shape inference on the parsed protobuf first, so the values arrive
    typed and shaped without serializing the model back for it. ``lift``: the main
    graph's Constant nodes become initializers on the protobuf (``model.constants``; how
    many in ``model.meta[LIFTED_KEY]``), equal ones merged with ``merge`` (how many in
    ``model.meta[MERGED_KEY]``)."""
    proto, _ = read_proto(path)
    negative_dims_dynamic(proto)  # -1 is dynamic (onnxruntime reads it so)
    # lifted first: inference then writes no value_info for them (the tensor says it)
    lifted = lift_constants(proto, merge=merge) if lift else Lifted(0)
    described = proto  # what the file said, before inference says more
    if infer:
        proto = infer_proto(proto)
    model = from_proto(proto)
    remember_declared(model, described)
    if lifted.constants:
        model.meta[LIFTED_KEY] = lifted.constants
    if lifted.merged:
        model.meta[MERGED_KEY] = lifted.merged
    ir.external_data.set_base_dir(model.graph, os.path.dirname(os.path.abspath(path)))
    return model


def read_model(path: str | os.PathLike[str]) -> ir.Model:
    """Load a file opfuse or onnxruntime wrote (no input checks), setting aside what
    onnx-ir cannot hold as ``load_model`` does."""
    proto = onnx.load_model(str(path), load_external_data=False)
    negative_dims_dynamic(proto)
    model = from_proto(proto)
    remember_declared(model, proto)
    ir.external_data.set_base_dir(model.graph, os.path.dirname(os.path.abspath(path)))
    return model


def must_pass_unchanged(model: ir.Model) -> str | None:
    """Why the loaded model must be written exactly as it was read (onnx-ir could hold
    it only without a part), or None."""
    aside = model.meta.get(META_KEY)
    return aside.unchanged if aside else None


def set_aside_notes(model: ir.Model) -> list[str]:
    """What the loader set aside for onnx-ir, in words for the summary."""
    aside = model.meta.get(META_KEY)
    return list(aside.notes) if aside else []


def copy_model(model: ir.Model) -> ir.Model:
    """An independent copy (through the protobuf), keeping what the loader set aside."""
    copy = ir.from_proto(ir.to_proto(model))
    for key in (META_KEY, DECLARED_KEY):
        if key in model.meta:
            copy.meta[key] = model.meta[key]
    return copy


def _restore_file(path: Path, aside: SetAside) -> None:
    """Put back into a written model file what the loader set aside (external tensors
    stay where they were written)."""
    proto = onnx.load_model(str(path), load_external_data=False)
    restore(proto, aside)
    path.write_bytes(proto.SerializeToString())


def has_external_data(model: ir.Model) -> bool:
    return any(isinstance(v.const_value, ir.ExternalTensor) for v in _all_initializers(model))


def tensor_bytes(model: ir.Model) -> int:
    total = 0
    for value in _all_initializers(model):
        tensor = value.const_value
        if tensor is not None:
            total += tensor.nbytes
    return total


def _all_initializers(model: ir.Model) -> Iterator[ir.Value]:
    for graph in all_graphs(model.graph):
        yield from graph.initializers.values()


def check_output_path(
    out: str | os.PathLike[str],
    inputs: list[str | os.PathLike[str]],
    labels: list[str] | None = None,
) -> Path:
    """Refuse an output that would overwrite an input or cannot be written. ``labels``
    names each input in the message (default: "input model")."""
    target = Path(out)
    for i, inp in enumerate(inputs):
        label = labels[i] if labels and i < len(labels) else "input model"
        if (Path(inp).exists() and target.exists() and os.path.samefile(inp, target)) or (
            Path(inp).resolve() == target.resolve()
        ):
            raise OpfuseError(f"{target}: output path is the {label}; choose another path")
    folder = target.parent if str(target.parent) else Path(".")
    if folder.exists() and not folder.is_dir():
        raise OpfuseError(f"{target}: output folder {folder} is not a folder")
    if not folder.is_dir():
        raise OpfuseError(f"{target}: output folder {folder} does not exist")
    if target.is_dir():
        raise OpfuseError(f"{target}: output path is a folder")
    _probe_writable(target, folder)
    return target


def check_outputs(
    model: str | os.PathLike[str], paths: list[tuple[str, str | os.PathLike[str] | None]]
) -> None:
    """Every output (an option name and its path) writable, none the input model nor an
    earlier output."""
    given = [(flag, p) for flag, p in paths if p is not None]
    for i, (_flag, path) in enumerate(given):
        others: list[str | os.PathLike[str]] = [model, *(p for _, p in given[:i])]
        labels = ["input model"] + [f"{f} path" for f, _ in given[:i]]
        check_output_path(path, others, labels)


def _probe_writable(target: Path, folder: Path) -> None:
    """Create and remove a temporary file in ``folder``: os.access says yes to root
    everywhere, and pseudo file systems (/proc, /sys) refuse only when written to."""
    try:
        fd, name = tempfile.mkstemp(prefix=STAGING_PREFIX + "probe-", dir=folder)
    except OSError as exc:
        raise OpfuseError(
            f"{target}: cannot write in output folder {folder}: {exc.strerror or exc}"
        ) from None
    os.close(fd)
    os.unlink(name)


# Temporary names beside an output: staging folders, write probes and report files, each
# the prefix, their kind and tempfile's 8 random characters (the kind keeps a user's own
# ".opfuse-settings" or the like out of the sweep). A save killed outright
# (SIGKILL, power loss) leaves one behind; the next save into that folder removes those
# older than STALE_SECONDS (a live save renames or removes its own within seconds to
# minutes; a day leaves any slow save on a shared folder alone).
STAGING_PREFIX = ".opfuse-"
STAGING_NAME = re.compile(r"\.opfuse-(?:stage|probe|report)-[a-z0-9_]{8}(?:\.tmp)?")
STALE_SECONDS = 24 * 3600


def remove_stale_staging(folder: Path, now: float | None = None) -> list[Path]:
    """Remove opfuse's own temporary files and folders older than STALE_SECONDS from
    ``folder``; return what was removed. Never fails a save: errors are ignored."""
    removed: list[Path] = []
    limit = (time.time() if now is None else now) - STALE_SECONDS
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        if not STAGING_NAME.fullmatch(entry.name):
            continue
        try:
            if entry.is_symlink() or entry.stat(follow_symlinks=False).st_mtime > limit:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
            removed.append(Path(entry.path))
        except OSError:
            continue
    return removed


def write_text(
    out: str | os.PathLike[str],
    text: str,
    *,
    inputs: Iterable[str | os.PathLike[str]] = (),
    labels: list[str] | None = None,
    what: str = "the report",
) -> Path:
    """Write a text file atomically: a temporary file in the target's folder, renamed
    over the target only once complete. Refuses the paths ``check_output_path`` does
    (``inputs``: the files this output must never replace, named by ``labels``)."""
    return write_bytes(out, text.encode("utf-8"), inputs=inputs, labels=labels, what=what)


def write_bytes(
    out: str | os.PathLike[str],
    data: bytes,
    *,
    inputs: Iterable[str | os.PathLike[str]] = (),
    labels: list[str] | None = None,
    what: str = "the report",
) -> Path:
    """``write_text`` for bytes (an .npz of arrays)."""
    target = check_output_path(out, list(inputs), labels)
    remove_stale_staging(target.parent)
    name = ""
    try:
        fd, name = tempfile.mkstemp(
            prefix=STAGING_PREFIX + "report-", suffix=".tmp", dir=target.parent
        )
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(name, 0o666 & ~_umask())  # as a plain open() would create it
        os.replace(name, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            if name:
                os.unlink(name)
        raise OpfuseError(f"{target}: cannot write {what}: {exc.strerror or exc}") from None
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def staged_save(
    model: ir.Model,
    out: str | os.PathLike[str],
    *,
    input_path: str | os.PathLike[str] | None = None,
    external: bool | None = None,
) -> Iterator[Path]:
    """Write ``model`` into a staging folder beside ``out`` and yield the staged path;
    move it into place only when the block finishes without an exception.

    External data goes to ``<out>.data`` when ``external`` is true, or by default when
    the input had external data or the weights are over 2 GB.
    """
    target = check_output_path(out, [input_path] if input_path else [])
    if external is None:
        external = has_external_data(model) or tensor_bytes(model) >= TWO_GB
    data_name = target.name + ".data" if external else None
    if data_name:
        _refuse_input_data_file(model, target.parent / data_name, input_path)
    remove_stale_staging(target.parent)
    try:
        staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX + "stage-", dir=target.parent))
    except OSError as exc:
        raise OpfuseError(f"{target}: cannot write: {exc.strerror or exc}") from None
    try:
        staged = staging / target.name
        try:
            with _without_derivable_value_info(model):
                ir.save(model, staged, external_data=data_name)
            aside = model.meta.get(META_KEY)
            if aside:
                _restore_file(staged, aside)
        except OSError as exc:
            raise OpfuseError(f"{target}: cannot write: {exc.strerror or exc}") from None
        yield staged
        _move_into_place(staging, staged, target, data_name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def _without_derivable_value_info(model: ir.Model) -> Iterator[None]:
    """Save without value_info that only repeats what a reader derives: onnx-ir writes one
    for every typed initializer (the tensor says it) and for every inferred intermediate,
    so even a model nothing changed would grow on disk. Graph inputs and outputs, outputs
    of non-default-domain ops, and the values the input file described (and, in a model
    that described its values, the ones the passes made: ``value_info.Declared.keeps``)
    keep theirs: a runtime's fusions read them (onnxruntime's SkipLayerNormalization
    needs the shapes of its Add's inputs, which a dynamo export's value_info gives)."""
    seen = declared(model)
    saved = []
    for graph in all_graphs(model.graph):
        values = [v for v in graph.initializers.values() if not v.is_graph_input()]
        for node in graph:
            if node.domain in DEFAULT_DOMAINS:
                values += [o for o in node.outputs if seen is None or not seen.keeps(o.name)]
        for value in values:
            if not value.is_graph_output() and (value.type or value.shape):
                saved.append((value, value.type, value.shape))
                value.type, value.shape = None, None
    try:
        yield
    finally:
        for value, type_, shape in saved:
            value.type, value.shape = type_, shape


def _move_into_place(staging: Path, staged: Path, target: Path, data_name: str | None) -> None:
    """Move the staged data file, then the model, into place. If a move fails, the old
    output stays a consistent pair: its data file is put back (or the new one removed)."""
    data_target = target.parent / data_name if data_name else None
    backup: Path | None = None
    moved_data = False
    try:
        if data_name and data_target and (staging / data_name).exists():
            if data_target.exists():
                backup = staging / (".old-" + data_name)
                os.replace(data_target, backup)
            os.replace(staging / data_name, data_target)
            moved_data = True
        os.replace(staged, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            if backup is not None and data_target is not None and backup.exists():
                os.replace(backup, data_target)
            elif moved_data and data_target is not None:
                data_target.unlink()
        raise OpfuseError(f"{target}: cannot write: {exc.strerror or exc}") from None


def external_data_files(path: str | os.PathLike[str]) -> set[Path]:
    """The resolved external data files a model file refers to."""
    p = Path(path)
    proto = onnx.load_model(str(p), load_external_data=False)
    files = set()
    for tensor in _iter_tensor_protos(proto.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            location = {e.key: e.value for e in tensor.external_data}.get("location", "")
            files.add((p.parent / location).resolve())
    return files


def _refuse_input_data_file(
    model: ir.Model, data_path: Path, input_path: str | os.PathLike[str] | None
) -> None:
    """Never write the output's external data over a file the input (or the model
    still being written, whose tensors may be memory-mapped from it) reads."""
    used = external_data_files(input_path) if input_path is not None else set()
    for value in _all_initializers(model):
        tensor = value.const_value
        if isinstance(tensor, ir.ExternalTensor):
            used.add((Path(tensor.base_dir) / tensor.location).resolve())
    if data_path.resolve() in used:
        raise OpfuseError(
            f"{data_path}: is the input's external data file; choose another output name"
        )


def save_model(
    model: ir.Model,
    out: str | os.PathLike[str],
    *,
    input_path: str | os.PathLike[str] | None = None,
    external: bool | None = None,
) -> Path:
    """Write a model atomically (see ``staged_save``)."""
    with staged_save(model, out, input_path=input_path, external=external):
        pass
    return Path(out)
