"""Entry point: `xbench COMMAND ...`. Errors the user can fix print one line, never a traceback."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

import xbench
from xbench.cli import (
    allreduce_cmd,
    backends_cmd,
    compare_cmd,
    diff_cmd,
    env_cmd,
    export_cmd,
    models_cmd,
    recommend_cmd,
    report_cmd,
    sweep_cmd,
    verify_cmd,
)
from xbench.cli.consoles import guarded_stdout
from xbench.errors import Interrupted, XbenchError, one_line
from xbench.results.records import ResultsNotWritten

BAD_INPUT, NOT_WRITTEN, INTERRUPTED = 2, 3, 130

app = typer.Typer(
    name="xbench",
    help="Which framework trains fastest on my model and batch, and do more devices help?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("compare")(compare_cmd.compare)
app.command("backends")(backends_cmd.backends)
app.command("models")(models_cmd.models)
app.command("env")(env_cmd.env)
app.command("allreduce")(allreduce_cmd.allreduce)
app.command("verify")(verify_cmd.verify)
app.command("report")(report_cmd.report)
app.command("export")(export_cmd.export)
app.command("diff")(diff_cmd.diff)
app.command("sweep")(sweep_cmd.sweep)
app.command("recommend")(recommend_cmd.recommend)


@app.callback(invoke_without_command=True)
def _root(version: bool = typer.Option(False, "--version", help="Print xbench's version and exit.")) -> None:
    if version:
        typer.echo(f"xbench {xbench.__version__}")
        raise typer.Exit()


# typer >= 0.29 vendors click; find its base exception without importing click by name.
# Any: click's type is not importable by name here, and its `format_message` is what is used.
_CLICK_ERROR: type[Any] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")

def variadic_options() -> frozenset[str]:
    """Every option of every command that takes several values (a list), so that each takes
    them the same natural way: `--backends tf jax`, `--variants jax:fused torch:compile`. No
    command has both such an option and a positional argument, which this would swallow."""
    group: Any = typer.main.get_command(app)
    return frozenset(flag for command in group.commands.values() for param in command.params
                     if param.param_type_name == "option" and param.multiple for flag in param.opts)


def command_line() -> Any:
    """Every command, as the parser runs them: on/off flags (`--html`, `--no-verify`) shown in
    the help without a value type (typer prints `<bool>`, which reads as if they took `true`)."""
    group: Any = typer.main.get_command(app)
    for command in (group, *group.commands.values()):
        for param in command.params:
            if getattr(param, "is_flag", False) and not getattr(param, "count", False):
                param.metavar = ""
        command.get_help_option = _without_type(command.get_help_option)  # click adds --help per call
    return group


def _without_type(get_help_option: Any) -> Any:
    def wrapped(ctx: Any) -> Any:
        option = get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option
    return wrapped


def expand_variadic(argv: list[str]) -> list[str]:
    """Rewrite `--backends tf jax` (or `--backends=tf jax`) as `--backends tf --backends jax`
    for the parser."""
    variadic = variadic_options()
    out: list[str] = []
    option = None
    for token in argv:
        if token.startswith("-"):
            flag = token.partition("=")[0]
            option = flag if flag in variadic else None
            out.append(token)
        elif option and out[-1] != option:
            out += [option, token]
        else:
            out.append(token)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code: 0 ok, 1 trials failed (diff: a slowdown), 2 bad
    input, 3 results could not be written, 4 (diff --fail-underpowered) a configuration that
    could not have detected the threshold's change, 130 interrupted."""
    errors = Console(stderr=True, highlight=False)
    args = expand_variadic(list(sys.argv[1:] if argv is None else argv))
    take_interrupts()
    with guarded_stdout() as stdout, one_line_warnings():
        code = _run_command(args, errors)
    if stdout.lost is not None:
        errors.print(f"[red]error:[/] could not write to standard output ({escape(stdout.lost)}); "
                     "the files xbench writes (records, reports) are not affected", soft_wrap=True)
        return max(code, NOT_WRITTEN) if code != INTERRUPTED else code
    return code


def _run_command(args: list[str], errors: Console) -> int:
    """The command's exit code, every error a user can act on as one line."""
    try:
        code = command_line()(args=args, prog_name="xbench", standalone_mode=False)
    except ResultsNotWritten as err:
        errors.print(f"[red]error:[/] {escape(str(err))}", soft_wrap=True)
        return NOT_WRITTEN
    except XbenchError as err:
        errors.print(f"[red]error:[/] {escape(str(err))}", soft_wrap=True)
        return BAD_INPUT
    except Interrupted as err:
        errors.print(escape(str(err)), soft_wrap=True)
        return INTERRUPTED
    except (typer.Abort, KeyboardInterrupt):
        errors.print("interrupted")
        return INTERRUPTED
    except _CLICK_ERROR as err:
        message = err.format_message()
        if not message.strip():  # bare `xbench`: the parser printed the help, which says it all
            return BAD_INPUT
        errors.print(f"[red]error:[/] {escape(message)}", soft_wrap=True)
        return BAD_INPUT
    if code == INTERRUPTED:  # typer turns a Ctrl-C that reaches it into this exit code, silently
        errors.print("interrupted")
    return code if isinstance(code, int) else 0


WARNING_CHARS = 500  # a warning names entry points and values a plugin chose: any length


@contextlib.contextmanager
def one_line_warnings() -> Iterator[None]:
    """Warnings (a plugin shadowing a built-in backend, one that fails to load) as one clean
    line each, without Python's source location and echo of the line that raised them. Only
    their format changes: whoever records warnings (`catch_warnings(record=True)`) still does."""
    def formatted(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> str:
        return f"warning: {one_line(str(message), WARNING_CHARS)}\n"

    saved = warnings.formatwarning
    warnings.formatwarning = formatted
    try:
        yield
    finally:
        warnings.formatwarning = saved


def take_interrupts() -> None:
    """Ctrl-C (SIGINT) stops a run, however xbench was started: a shell starts a background
    job (`xbench compare ... &`, CI scripts, `make test &`) with SIGINT ignored, and Python then
    never raises KeyboardInterrupt, so `kill -INT` did nothing and the run's workers lived on.
    nohup ignores SIGHUP, not SIGINT, so nothing deliberate is undone here."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _interrupt(signum: int, frame) -> None:
    raise KeyboardInterrupt  # SIGTERM/SIGHUP end a run as Ctrl-C does: records kept, workers reaped


def run() -> None:
    for name in ("SIGTERM", "SIGHUP"):
        found = getattr(signal, name, None)
        # Under nohup SIGHUP is ignored on purpose: the run is to outlive its terminal.
        if found is not None and signal.getsignal(found) is not signal.SIG_IGN:
            signal.signal(found, _interrupt)
    sys.exit(main())
