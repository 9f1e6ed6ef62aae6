"""The ``opfuse`` command line: one module per command (optimize, verify, passes, tune,
profile, advise, batch), sharing the option declarations of ``cli.options`` and the
consoles of ``cli.console``; this module is the group and the entry point. Each command
parses its options into the API's settings objects and calls ``opfuse.api``; a setting the
API refuses (``SettingsError``) is said with the command's flag (``cli.options.flag_error``).

Errors are one line on stderr with exit status 2 (1 for a failed verification), never a
traceback unless ``--debug`` is given. Logs, warnings and progress go to stderr; stdout
holds only the result (a table, or JSON with ``--format json``).
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import version

import click

from opfuse.cli.advise import advise, profile
from opfuse.cli.batch import batch
from opfuse.cli.console import DEBUG, err
from opfuse.cli.optimize import optimize
from opfuse.cli.options import speaks_flags
from opfuse.cli.passes import passes
from opfuse.cli.quantize import quantize
from opfuse.cli.tune import tune
from opfuse.cli.verify import verify
from opfuse.errors import EXIT_STATUSES, OpfuseError
from opfuse.pipeline.gcpause import one_model_per_process


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_STATUSES)
@click.version_option(version("opfuse"), prog_name="opfuse")
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
def app(debug: bool) -> None:
    """Operator-fusion optimizer and advisor for ONNX inference models."""
    DEBUG["on"] = debug


for _command in (optimize, verify, passes, profile, advise, tune, quantize, batch):
    app.add_command(speaks_flags(_command))  # the API's refusals said in the flags


# commands that handle one model and exit: their process skips the collector's last walk
ONE_MODEL_COMMANDS = frozenset({"optimize"})


def main() -> None:
    """Console entry point: one-line errors and exit statuses instead of tracebacks."""
    command = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
    if command in ONE_MODEL_COMMANDS:
        one_model_per_process()
    try:
        app.main(standalone_mode=False)
    except OpfuseError as exc:
        if DEBUG["on"]:
            raise
        err.print(f"opfuse: error: {exc}", soft_wrap=True, markup=False)
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        err.print("opfuse: aborted")
        sys.exit(130)
    except click.ClickException as exc:
        err.print(f"opfuse: error: {exc.format_message()}", soft_wrap=True, markup=False)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # a bug of ours: still one line; --debug shows the trace
        if DEBUG["on"] or os.environ.get("OPFUSE_DEBUG"):
            raise
        err.print(
            f"opfuse: internal error: {type(exc).__name__}: {exc} (rerun with --debug)",
            soft_wrap=True,
            markup=False,
        )
        sys.exit(3)


if __name__ == "__main__":
    main()
