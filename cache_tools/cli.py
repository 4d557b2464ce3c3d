"""`kernelgen` entry point: argparse wiring and error reporting. The commands live in their modules.

Results go to stdout (tables, or JSON with --json); progress and errors to stderr. Exit codes:
0 ok, 1 a build failed / something is missing or bad, 2 usage error, 130 interrupted.
Set KERNELGEN_VERBOSE=1 to get a traceback with an error.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

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
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a reader that left shows here, not at exit
        return code
    except BrokenPipeError:  # `kernelgen cache ls | head`: the reader left, not an error
        # Python's recipe: further writes (the flush at exit) go nowhere instead of failing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
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


if __name__ == "__main__":
    sys.exit(main())
