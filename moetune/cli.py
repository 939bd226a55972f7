"""The `moetune` command line: argument parsing and error handling only.

Each command lives in `moetune/commands/<name>.py` as a click command whose
logic is a plain function returning data. This module wires them into one
group and owns the exit codes:

    0    success
    1    a user or data problem (`MoetuneError`): one line, ``Error: ...``
    2    misuse of the command line (click's usage errors)
    3    an unexpected error: one line pointing at a log with the traceback
    4    `moetune check`: an engine's tuned file for the shape is missing or invalid
    130  interrupted by SIGINT (Ctrl-C); partial results are already on disk
    143  stopped by SIGTERM; likewise (129: SIGHUP, a closed terminal)

A reader of stdout that goes away early (``moetune archs | head``) is no error:
the command stops quietly with 0. A stdout that cannot be written (``> /dev/full``)
is one line on stderr and exit 1.

Importing this module must stay cheap: `moetune extract` may not import torch
or triton, so command modules import them inside their functions only.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import tempfile
import threading
import traceback
import warnings

import click

from moetune import __version__
from moetune.errors import Interrupted, MoetuneError, MoetuneWarning, Terminated

# (module, attribute) of every command, in the order `moetune --help` lists them.
COMMANDS = [
    ("moetune.commands.extract", "extract"),
    ("moetune.commands.check", "check"),
    ("moetune.commands.tune", "tune"),
    ("moetune.commands.report", "report"),
    ("moetune.commands.benchmark", "benchmark"),
    ("moetune.commands.archs", "archs"),
    ("moetune.commands.validate", "validate"),
]


def summary_line(command: click.Command) -> str:
    """A command's summary for `moetune --help`: its short_help, else its help's first
    sentence, whole (click's default cuts it with "..." to fit the terminal)."""
    if command.short_help:
        return command.short_help
    first = (command.help or "").strip().split("\n\n")[0]
    return " ".join(first.split())


class _OutputClosed(Exception):
    """Whoever read stdout has gone (``moetune ... | head``): nothing is wrong, stop quietly."""


class _Cli(click.Group):
    """A group whose commands come from COMMANDS; a missing module is skipped."""

    def invoke(self, ctx: click.Context) -> object:
        # click turns a closed pipe into exit status 1; moetune treats it as success.
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise _OutputClosed from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, summary_line(command)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)  # wraps long summaries onto more lines, never cuts

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for _, name in COMMANDS if self.get_command(ctx, name) is not None]

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        # click suggests close names from `self.commands`, empty here (commands load lazily).
        try:
            return super().resolve_command(ctx, args)
        except click.exceptions.NoSuchCommand as exc:
            raise click.exceptions.NoSuchCommand(
                exc.command_name, possibilities=[name for _, name in COMMANDS], ctx=ctx
            ) from None

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        for module_name, name in COMMANDS:
            if name == cmd_name:
                try:
                    module = importlib.import_module(module_name)
                except ModuleNotFoundError as exc:
                    if exc.name == module_name:
                        return None
                    raise
                return getattr(module, name)
        return None


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="moetune")
def cli() -> None:
    """Tune vLLM's and SGLang's fused-MoE Triton kernel for your model and GPU.

    \b
    Find the MoE shape of a model (no GPU, no torch needed):
        moetune extract --model Qwen/Qwen3-30B-A3B --tp 1
    Tune it on this machine's GPUs and write drop-in config files:
        moetune tune --model Qwen/Qwen3-30B-A3B --tp 1 --save-dir tuned
    Shell completion (commands, options, --model ids and paths, --dtype...):
    add to ~/.bashrc (zsh: zsh_source in ~/.zshrc; fish: fish_source)
        eval "$(_MOETUNE_COMPLETE=bash_source moetune)"
    """


def _write_crash_log() -> str:
    fd, path = tempfile.mkstemp(prefix="moetune-crash-", suffix=".log")
    with os.fdopen(fd, "w") as log:
        log.write(f"moetune {__version__}, Python {sys.version.split()[0]}\n")
        log.write(f"argv: {sys.argv}\n\n")
        log.write(traceback.format_exc())
    return path


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(signum)


# SIGTERM and SIGHUP (a closed terminal) unwind like Ctrl-C, so the cleanup runs.
_TERMINATING = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)
)


def _ignore_stop_signals() -> None:
    """On the way out after a signal: a second Ctrl-C must not print a traceback."""
    for signum in (signal.SIGINT, *_TERMINATING):
        signal.signal(signum, signal.SIG_IGN)


def _format_warning(message, category, filename, lineno, line=None) -> str:  # noqa: ANN001
    """moetune's own warnings as one line; anyone else's as Python prints them."""
    if issubclass(category, MoetuneWarning):
        return f"Warning: {message}\n"
    return _python_format_warning(message, category, filename, lineno, line)


_python_format_warning = warnings.formatwarning


def _stop_writing() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush meets no closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (an in-process runner)
        pass


def _raised_writing_stdout(exc: BaseException) -> bool:
    """Whether `exc` came from printing to stdout: click's echo (not to stderr) or rich's
    console, the two ways moetune prints."""
    frames = traceback.walk_tb(exc.__traceback__)
    for frame, _ in frames:
        code = frame.f_code
        path = code.co_filename.replace(os.sep, "/")
        if path.endswith("click/utils.py") and code.co_name == "echo":
            return not frame.f_locals.get("err")
        if path.endswith("rich/console.py"):
            return True
    return False


def main(argv: list[str] | None = None) -> None:
    """Run the CLI with moetune's exit codes (see the module docstring)."""
    if threading.current_thread() is threading.main_thread():
        for signum in _TERMINATING:
            signal.signal(signum, _raise_terminated)
    warnings.formatwarning = _format_warning
    try:
        status = cli.main(args=argv, prog_name="moetune", standalone_mode=False)
    except _OutputClosed:
        _stop_writing()
        sys.exit(0)
    except SystemExit as exc:
        # rich answers a closed pipe with SystemExit(1), raised while handling the
        # BrokenPipeError: a closed pipe all the same.
        if isinstance(exc.__context__, BrokenPipeError):
            _stop_writing()
            sys.exit(0)
        raise
    except Interrupted as exc:  # a tune: its workers are gone, its results saved
        _ignore_stop_signals()
        click.echo(exc.message, err=True)
        sys.exit(exc.exit_code)
    except Terminated as exc:
        _ignore_stop_signals()
        click.echo("Terminated", err=True)
        sys.exit(128 + exc.signum)
    except click.exceptions.Abort:
        click.echo("Interrupted (^C)", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("Interrupted (^C)", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except MoetuneError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(1)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:  # noqa: BLE001 - the last line of defence
        if isinstance(exc, OSError) and _raised_writing_stdout(exc):
            # stdout cannot take the output (`> /dev/full`, a full disk): no bug of moetune's.
            _stop_writing()
            click.echo(f"Error: cannot write to stdout: {exc.strerror or exc}", err=True)
            sys.exit(1)
        path = _write_crash_log()
        click.echo(f"Error: unexpected {type(exc).__name__}: {exc} (traceback in {path})", err=True)
        sys.exit(3)
    # A command may end with click's Exit(code) (`check` exits 4 on a missing file),
    # which click returns instead of raising when not in standalone mode.
    sys.exit(status if isinstance(status, int) and not isinstance(status, bool) else 0)
