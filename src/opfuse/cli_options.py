"""Command-line options that shape the optimized graph, shared by `optimize` and `batch`
(one declaration, so both commands take the same names, choices and defaults)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

from opfuse.advisor.target import builtin_targets
from opfuse.rewrite.context import DEFAULT_FOLD_SIZE_LIMIT

F = TypeVar("F", bound=Callable[..., object])


def graph_options(f: F) -> F:
    """--fold-size-limit, --target-opset, --layout, --target."""
    for option in reversed(
        [
            click.option(
                "--fold-size-limit",
                default=DEFAULT_FOLD_SIZE_LIMIT,
                show_default=True,
                help="Largest constant (bytes) a fold may create, unless it frees as much; "
                "a fold also grows the model by at most 4 KiB.",
            ),
            click.option(
                "--target-opset",
                type=int,
                help="Convert to this opset first (enables newer fusions). "
                "[default: keep the model's]",
            ),
            click.option(
                "--layout",
                type=click.Choice(["keep", "nchw", "nhwc"]),
                default="keep",
                show_default=True,
                help="Layout of image inputs/outputs; nchw changes the model's interface.",
            ),
            click.option(
                "--target",
                type=click.Choice(builtin_targets()),
                help="Runtime whose UBFusion passes may run. [default: none]",
            ),
        ]
    ):
        f = option(f)
    return f
