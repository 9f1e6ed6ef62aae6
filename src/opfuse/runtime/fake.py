"""A runtime with deterministic timings for unit tests: a model's latency is the sum of
per-op-type costs over its nodes, read from the file, and its clock advances only by runs
(by that latency, or by it times seeded random noise when asked). It remembers the shapes
it was fed (``FakeRuntime.fed``)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Collection, Mapping

import numpy as np
import onnx


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeSession:
    def __init__(
        self,
        clock: FakeClock,
        seconds: float,
        jitter: Callable[[], float] = lambda: 1.0,
        fed: set[tuple[tuple[str, tuple[int, ...]], ...]] | None = None,
    ) -> None:
        self.clock = clock
        self.seconds = seconds
        self.jitter = jitter
        self.fed = fed

    def run(self, feeds: dict[str, np.ndarray]) -> object:
        if self.fed is not None:
            self.fed.add(tuple((k, tuple(np.shape(v))) for k, v in sorted(feeds.items())))
        self.clock.now += self.seconds * self.jitter()
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
        noise: float = 0.0,
        seed: int = 0,
        removes: Collection[str] = (),
    ) -> None:
        """``clock``: share one between runtimes measured together (session settings);
        ``scale``: every latency times this (a faster or slower setting); ``noise``: each
        run takes its latency times a seeded uniform draw in [1 - noise, 1 + noise];
        ``removes``: op types the runtime's own optimizations remove (``optimized_ops``)."""
        self.costs = dict(costs or {})
        self.default = default
        self.clock = clock or FakeClock()
        self.scale = scale
        self.noise = noise
        self.rng = np.random.default_rng(seed)
        self.removes = frozenset(removes)
        self.loaded: list[str] = []
        # the shapes of every feed run: ((input name, shape), ...) per distinct feed
        self.fed: set[tuple[tuple[str, tuple[int, ...]], ...]] = set()

    def jitter(self) -> float:
        return 1.0 + self.noise * (2 * float(self.rng.random()) - 1) if self.noise else 1.0

    def latency(self, path: str | os.PathLike[str]) -> float:
        graph = onnx.load_model(str(path), load_external_data=False).graph
        return self.scale * sum(self.costs.get(node.op_type, self.default) for node in graph.node)

    def load(self, path: str | os.PathLike[str]) -> FakeSession:
        self.loaded.append(str(path))
        return FakeSession(self.clock, self.latency(path), self.jitter, self.fed)

    def optimized_ops(self, path: str | os.PathLike[str]) -> Counter[str]:
        """The op types the "runtime" runs: the file's, less those in ``removes``."""
        graph = onnx.load_model(str(path), load_external_data=False).graph
        return Counter(n.op_type for n in graph.node if n.op_type not in self.removes)

    def describe(self) -> str:
        return f"fake {self.version}"
