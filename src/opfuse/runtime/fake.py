"""A runtime with deterministic timings for unit tests: a model's latency is the sum of
per-op-type costs over its nodes, read from the file, and its clock advances only by runs."""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
import onnx


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeSession:
    def __init__(self, clock: FakeClock, seconds: float) -> None:
        self.clock = clock
        self.seconds = seconds

    def run(self, feeds: dict[str, np.ndarray]) -> object:
        self.clock.now += self.seconds
        return []


class FakeRuntime:
    """``costs``: seconds per node of an op type (``default`` for the others)."""

    name = "fake"
    version = "1.0"

    def __init__(
        self,
        costs: Mapping[str, float] | None = None,
        default: float = 1e-3,
        *,
        clock: FakeClock | None = None,
        scale: float = 1.0,
    ) -> None:
        """``clock``: share one between runtimes measured together (session settings);
        ``scale``: every latency times this (a faster or slower setting)."""
        self.costs = dict(costs or {})
        self.default = default
        self.clock = clock or FakeClock()
        self.scale = scale
        self.loaded: list[str] = []

    def latency(self, path: str | os.PathLike[str]) -> float:
        graph = onnx.load_model(str(path), load_external_data=False).graph
        return self.scale * sum(self.costs.get(node.op_type, self.default) for node in graph.node)

    def load(self, path: str | os.PathLike[str]) -> FakeSession:
        self.loaded.append(str(path))
        return FakeSession(self.clock, self.latency(path))

    def describe(self) -> str:
        return f"fake {self.version}"
