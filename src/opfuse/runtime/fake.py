"""A runtime with deterministic timings for unit tests: a model's latency is the sum of
per-op-type costs over its nodes, read from the file, and its clock advances only by runs
(by that latency, or by it times seeded random noise when asked). It can also have the
order effects a real machine has: a slot of the round that is slower, a run right after
the same session's that is faster (its weights still in the caches), the first sessions
loaded slower for their whole life. It remembers the shapes it was fed
(``FakeRuntime.fed``)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx


class FakeClock:
    """Seconds, advanced only by runs; it counts the runs and remembers the last session."""

    def __init__(self) -> None:
        self.now = 0.0
        self.runs = 0
        self.last: object = None

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class OrderEffects:
    """``slots``: the k-th run on the clock takes its latency times ``slots[k % len]``
    (with as many factors as models measured together, a slot of the round that is slower
    or faster); ``after_itself``: a run right after the same session's run takes it times
    this; ``slow_first``: the first that many sessions the runtime loads take it times
    ``slow_by`` for their whole life."""

    slots: Sequence[float] = ()
    after_itself: float = 1.0
    slow_first: int = 0
    slow_by: float = 1.0


class FakeSession:
    def __init__(
        self,
        clock: FakeClock,
        seconds: float,
        jitter: Callable[[], float] = lambda: 1.0,
        effects: OrderEffects = OrderEffects(),
        fed: set[tuple[tuple[str, tuple[int, ...]], ...]] | None = None,
    ) -> None:
        self.clock = clock
        self.seconds = seconds
        self.jitter = jitter
        self.effects = effects
        self.fed = fed

    def run(self, feeds: dict[str, np.ndarray]) -> object:
        if self.fed is not None:
            self.fed.add(tuple((k, tuple(np.shape(v))) for k, v in sorted(feeds.items())))
        factor = self.jitter()
        if self.effects.slots:
            factor *= self.effects.slots[self.clock.runs % len(self.effects.slots)]
        if self.clock.last is self:
            factor *= self.effects.after_itself
        self.clock.now += self.seconds * factor
        self.clock.runs += 1
        self.clock.last = self
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
        effects: OrderEffects = OrderEffects(),
    ) -> None:
        """``clock``: share one between runtimes measured together (session settings);
        ``scale``: every latency times this (a faster or slower setting); ``noise``: each
        run takes its latency times a seeded uniform draw in [1 - noise, 1 + noise];
        ``removes``: op types the runtime's own optimizations remove (``optimized_ops``);
        ``effects``: the order effects of a real machine (``OrderEffects``)."""
        self.costs = dict(costs or {})
        self.default = default
        self.clock = clock or FakeClock()
        self.scale = scale
        self.noise = noise
        self.rng = np.random.default_rng(seed)
        self.removes = frozenset(removes)
        self.effects = effects
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
        seconds = self.latency(path)
        if len(self.loaded) <= self.effects.slow_first:
            seconds *= self.effects.slow_by
        return FakeSession(self.clock, seconds, self.jitter, self.effects, self.fed)

    def optimized_ops(self, path: str | os.PathLike[str]) -> Counter[str]:
        """The op types the "runtime" runs: the file's, less those in ``removes``."""
        graph = onnx.load_model(str(path), load_external_data=False).graph
        return Counter(n.op_type for n in graph.node if n.op_type not in self.removes)

    def describe(self) -> str:
        return f"fake {self.version}"
