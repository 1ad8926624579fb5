"""The console-script entry point: run one command, map every failure to one
``Error: ...`` line on stderr and its exit code (traceback only with ``--debug``)."""

from __future__ import annotations

import errno
import os
import sys

import typer

from mtpconv import console, gc_pause
from mtpconv.cli.app import app, as_flag, debug_requested
from mtpconv.errors import MtpconvError, interrupted, sigterm_interrupts


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run one command and exit with its status."""
    # Before torch is imported (commands import it lazily): idle OpenMP threads sleep
    # instead of spinning, which left the converter's own reader, hashing and FP8
    # threads a fraction of a 2-core machine (4 of 13 CPU-seconds in one conversion).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    gc_pause.freeze_on_resume()  # one process, one command: header records live to the end
    with sigterm_interrupts():  # every command cleans up its temporary files on SIGTERM too
        code = _run(argv)
    sys.exit(code)


def _run(argv: list[str] | None) -> int:
    """Run the app; turn every failure into one ``Error:`` line and an exit code."""
    try:
        # Not standalone: typer would print a usage error as a usage line plus a box.
        result = app(args=argv, standalone_mode=False)
    except typer.TyperException as exc:  # usage and parameter errors (exit 2)
        console.error(" ".join(exc.format_message().split()))
        return exc.exit_code
    except MtpconvError as exc:
        _show_traceback()
        console.error(exc.render(as_flag))
        return exc.exit_code
    except OSError as exc:
        # The library maps the failures it expects; any other OS failure (a full disk
        # while writing the manifest, a file that cannot be opened) is still one line.
        _show_traceback()
        console.error(_os_error_message(exc))
        return 1
    except KeyboardInterrupt:
        stopped = interrupted()
        console.error(str(stopped))
        return stopped.exit_code
    except typer.Abort:  # end of input at a prompt
        console.error("aborted.")
        return 1
    if result == 130:  # typer turns Ctrl-C into a silent exit 130: say it in one line
        console.error(str(interrupted()))
    return result if isinstance(result, int) else 0


def _show_traceback() -> None:
    if debug_requested():
        console.err_console.print_exception()


def _os_error_message(exc: OSError) -> str:
    where = f" ({exc.filename})" if exc.filename else ""
    if exc.errno == errno.ENOSPC:
        return f"no space left on the device{where}; free space and run again."
    return f"{exc.strerror or exc}{where}; run again with --debug for details."
