"""`kernelgen doctor`: can this machine build and cache kernels? Prints what it finds.

Checks NVRTC (version, targets), the CUDA headers, one small test compile (not cached), the cache
layers, the KERNELGEN_* knobs and the GPU if there is one. Exit 1 if NVRTC, the headers or the
test compile are unusable: kernels could then not be built here.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from kernelgen import __version__, arch, knobs
from kernelgen.core.jit import default_cache

from .cache_cmd import layer_info
from .table import format_table, human_bytes, print_json

TEST_ARCH = "sm_90a"


@dataclass
class Check:
    name: str
    ok: bool | None  # None: information, not pass/fail
    detail: str


def _guard(name: str, fn: Any) -> Check:
    """Run one check; an exception is its failure, reported with its message."""
    try:
        return fn()
    except Exception as e:
        return Check(name, False, f"{type(e).__name__}: {e}".strip())


def check_nvrtc() -> Check:
    from cupy_backends.cuda.libs import nvrtc

    from kernelgen.core.compile import nvrtc_version

    supported = tuple(nvrtc.getSupportedArchs())
    lacking = [a.name for a in arch.ARCHS.values() if a.cc not in supported]
    detail = f"{nvrtc_version()}; targets sm_{min(supported)}..sm_{max(supported)}"
    if lacking:
        return Check("nvrtc", False, f"{detail}; cannot build {', '.join(lacking)}: use NVRTC 12.9 or newer")
    return Check("nvrtc", True, f"{detail}; every kernelgen target ({', '.join(arch.ALL_ARCHS)}) supported")


def check_headers() -> Check:
    from kernelgen.core.compile import cuda_include_dir

    return Check("cuda headers", True, str(cuda_include_dir()))


def check_compile() -> Check:
    from kernelgen.core.compile import compile_cubin, resource_summary
    from kernelgen.core.render import render
    from kernelgen.kbit import E4M4Config

    cfg = E4M4Config(arch=TEST_ARCH)
    t0 = time.perf_counter()
    out = compile_cubin(cfg, render(cfg))
    regs = resource_summary(out.log)["registers"]
    return Check("test compile", True, f"{cfg.short()}: {time.perf_counter() - t0:.2f}s, "
                                       f"{human_bytes(len(out.cubin))} cubin, "
                                       f"{regs if regs is not None else 'no ptxas report'} registers")


def check_gpu() -> Check:
    if not arch.gpu_available():
        return Check("gpu", None, f"none: compile-only machine (prewarm builds --arch {TEST_ARCH} by default)")
    d = arch.device_info()
    return Check("gpu", True, f"{d.name}: {d.arch.name}, {d.sm_count} SMs, L2 {human_bytes(d.l2_bytes)}")


def knob_rows() -> list[dict[str, str]]:
    return [{"name": k.name, "value": os.environ.get(k.name, ""), "default": k.default, "help": k.help}
            for k in knobs.KNOBS]


def run(args: argparse.Namespace) -> int:
    checks = [
        Check("kernelgen", None, f"{__version__} (python {platform.python_version()}, {sys.executable})"),
        _guard("nvrtc", check_nvrtc),
        _guard("cuda headers", check_headers),
        _guard("test compile", check_compile),
        _guard("gpu", check_gpu),
    ]
    cache = default_cache()
    layers = layer_info(cache)
    for la in layers:
        state = "read-only layer" if la["readonly"] else ("writable" if la["writable"] else "NOT WRITABLE")
        state += "" if la["exists"] else ", absent"
        checks.append(Check("cache", None if la["readonly"] else la["writable"],
                            f"{la['path']} ({state}, {la['entries']} entries, {human_bytes(la['bytes'])})"))
    essential = {"nvrtc", "cuda headers", "test compile"}
    ok = all(c.ok is not False for c in checks if c.name in essential)
    if args.json:
        print_json({"ok": ok, "checks": [asdict(c) for c in checks], "knobs": knob_rows(),
                    "max_bytes": cache.max_bytes})
    else:
        mark = {True: "ok", False: "FAIL", None: "--"}
        print(format_table(("", "CHECK", "RESULT"), [(mark[c.ok], c.name, c.detail) for c in checks]))
        print("\nenvironment knobs:")
        print(format_table(("NAME", "VALUE", "DEFAULT", "MEANING"),
                           [(k["name"], k["value"] or "-", k["default"], k["help"]) for k in knob_rows()]))
        if not ok:
            print("\nkernelgen cannot build kernels here: fix the FAIL lines above", file=sys.stderr)
    return 0 if ok else 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="check NVRTC, headers, a test compile, the cache, the GPU",
                       description=__doc__)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)
