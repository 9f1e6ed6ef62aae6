"""onnxruntime with any installed execution provider (CPU by default)."""

from __future__ import annotations

import os
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from opfuse.errors import OpfuseError, first_line

# quiet and session_options moved to opfuse.model.sessions; the names stay importable from here
from opfuse.model.sessions import LEVELS, open_session
from opfuse.model.sessions import quiet as quiet
from opfuse.model.sessions import session_options as session_options
from opfuse.runtime import GRAPH_OPT_LEVELS


class OrtSession:
    def __init__(self, sess: ort.InferenceSession, path: str | os.PathLike[str] = "") -> None:
        self.sess = sess
        self.path = path
        self.quiet = ort.RunOptions()
        self.quiet.log_severity_level = 4  # a failure is reported once, as an OpfuseError

    def run(self, feeds: dict[str, np.ndarray]) -> object:
        try:
            return self.sess.run(None, feeds, self.quiet)
        except Exception as exc:  # onnxruntime raises its own exception types
            shapes = ", ".join(
                f"{k} {list(v.shape) if hasattr(v, 'shape') else 'sequence'}"
                for k, v in feeds.items()
            )
            raise OpfuseError(
                f"{self.path}: onnxruntime cannot run the model on inputs {shapes}: "
                f"{first_line(exc)}"
            ) from None


class OrtRuntime:
    name = "onnxruntime"
    version = ort.__version__
    clock = staticmethod(time.perf_counter)

    def __init__(
        self,
        provider: str | None = None,
        threads: int = 1,
        graph_opt: str = "all",
        execution_mode: str = "sequential",
        inter_threads: int = 1,
    ):
        available = ort.get_available_providers()
        provider = provider or "CPUExecutionProvider"
        if provider not in available:
            raise OpfuseError(
                f"--provider {provider}: not available in this onnxruntime ({', '.join(available)})"
            )
        if graph_opt not in GRAPH_OPT_LEVELS:
            raise OpfuseError(
                f"--graph-opt {graph_opt!r}: expected one of {', '.join(GRAPH_OPT_LEVELS)}"
            )
        self.provider = provider
        self.threads = threads
        self.graph_opt = graph_opt
        self.execution_mode = execution_mode
        self.inter_threads = inter_threads

    def load(self, path: str | os.PathLike[str]) -> OrtSession:
        sess = open_session(
            path,
            provider=self.provider,
            threads=self.threads,
            inter_threads=self.inter_threads,
            execution_mode=self.execution_mode,
            graph_opt=self.graph_opt,
        )
        return OrtSession(sess, path)

    def optimized_ops(self, path: str | os.PathLike[str]) -> Counter[str] | None:
        """Op types (with their domain, every graph) of the graph onnxruntime runs for
        ``path`` at these settings, read from the one it saves (None if it cannot save it):
        two files with equal counts are the same model to the runtime, as far as a
        rewrite can tell."""
        with tempfile.TemporaryDirectory(prefix="opfuse-ortgraph-") as tmp:
            saved = Path(tmp) / "optimized.onnx"
            try:  # a graph it cannot save only means: measure
                open_session(
                    path,
                    provider=self.provider,
                    threads=1,
                    inter_threads=1,
                    execution_mode="sequential",
                    graph_opt=self.graph_opt,
                    optimized_path=saved,
                )
                proto = onnx.load_model(str(saved), load_external_data=False)
            except Exception:  # an EP that cannot save its graph, a model over 2 GB
                return None
        return op_type_counts(proto.graph)

    def describe(self) -> str:
        level = str(LEVELS[self.graph_opt]).rsplit(".", 1)[-1]
        threads = "default threads" if self.threads == 0 else _plural(self.threads, "thread")
        mode = (
            f", parallel ({_plural(self.inter_threads, 'inter-op thread')})"
            if self.execution_mode == "parallel"
            else ""
        )
        return f"onnxruntime {self.version} {self.provider}, {level}, {threads}{mode}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def op_type_counts(graph: onnx.GraphProto) -> Counter[str]:
    """``domain::op_type`` (plain op_type in the default domain) of every node, in
    ``graph`` and the graphs its nodes hold (If/Loop/Scan bodies)."""
    counts: Counter[str] = Counter()
    stack = [graph]
    while stack:
        g = stack.pop()
        for node in g.node:
            counts[f"{node.domain}::{node.op_type}" if node.domain else node.op_type] += 1
            for attr in node.attribute:
                stack.extend([attr.g] if attr.HasField("g") else list(attr.graphs))
    return counts
