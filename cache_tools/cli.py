"""`kernelgen` entry point: argparse wiring and error reporting. The commands live in their modules.

Results go to stdout (tables, or JSON with --json); progress and errors to stderr. Exit codes:
0 ok, 1 a build failed / something is missing or bad, 2 usage error, 130 interrupted. A reader
that leaves (`kernelgen cache ls | head`, `kernelgen prewarm 2>&1 | head`) only silences the
output: the command finishes its work and exits with its own code.
Set KERNELGEN_VERBOSE=1 to get a traceback with an error.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from kernelgen import __version__, knobs
from kernelgen.errors import KernelgenError, UnsupportedConfigError

from . import UsageError, cache_cmd, doctor, prewarm


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kernelgen",
        description="Build ahead, inspect and maintain kernelgen's JIT kernel cache.",
        epilog="`kernelgen COMMAND --help` describes each command.",
    )
    parser.add_argument("--version", action="version", version=f"kernelgen {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    prewarm.add_parser(sub)
    cache_cmd.add_parser(sub)
    doctor.add_parser(sub)
    return parser


class _LeftReader:
    """A text stream that turns into /dev/null once its reader leaves (EPIPE), so a command's
    work and exit code do not depend on whether anyone still reads what it prints."""

    def __init__(self, stream: Any):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()

    def _gone(self) -> None:  # Python's recipe: later writes (and the flush at exit) go nowhere
        os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _fail(msg: str, code: int) -> int:
    if knobs.verbose():
        traceback.print_exc()
    print(f"kernelgen: error: {msg}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, or argparse's own usage error (code 2)
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 2
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _LeftReader(out), _LeftReader(err)
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a reader that left shows here, not at exit
        return code
    except (UsageError, UnsupportedConfigError) as e:
        return _fail(str(e), 2)
    except KernelgenError as e:
        return _fail(str(e), 1)
    except ValueError as e:  # a malformed KERNELGEN_* variable (knobs names it)
        return _fail(str(e), 2)
    except OSError as e:  # a path that is a folder, unreadable, missing, a full disk, ...
        return _fail(f"{e.filename or ''}: {e.strerror or e}" if e.filename else str(e), 1)
    except KeyboardInterrupt:
        print("kernelgen: interrupted", file=sys.stderr)
        return 130
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = out, err


if __name__ == "__main__":
    sys.exit(main())
