"""`kernelgen prewarm`: build ahead of time every config the selectors can pick.

The configs come only from each registered family's `prewarm_configs(archs, spec)`, the tables
the dispatch uses, so a prewarmed cache covers exactly what the ops can launch. Builds go through
`kernelgen.core.jit.build` (the cache's per-key file lock makes parallel builds, and several
prewarms at once, safe) in a pool of worker processes. `--check` compiles nothing: it reports the
configs missing from every cache layer (exit 1 if any), for CI and container builds.

Specs: `--bits` / `--dtypes` (and a profile file, see profile.py) narrow what each family yields.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from typing import Any

from kernelgen.core.config import KernelConfig
from kernelgen.core.registry import Family, families

from . import UsageError, profile, values
from .table import err, print_json

ERROR_LINES = 8  # lines of a failure's message shown in the summary
STATUSES = ("compiled", "cached", "unstored", "failed")
# the cache's warnings about what prewarm reports itself as "not stored"
UNSTORED_WARNING = r"kernelgen: (cache directory .* is not writable|could not write to cache)"


@dataclass(frozen=True)
class Plan:
    archs: list[str]
    specs: dict[str, dict[str, Any]]  # family name -> spec handed to its prewarm_configs
    configs: list[KernelConfig]


@dataclass
class Result:
    config: dict[str, Any]  # KernelConfig.as_dict()
    short: str
    status: str  # "compiled" | "cached" | "unstored" (compiled, the cache could not keep it) | "failed"
    seconds: float
    key: str = ""
    error: str = ""


# -- what to build ----------------------------------------------------------------------------
def make_plan(args: argparse.Namespace) -> Plan:
    prof = profile.load(args.profile) if args.profile else profile.Profile()
    arch_tokens = values.split_list(args.arch, "--arch") or prof.archs or [values.default_arch()]
    archs = values.resolve_archs(
        arch_tokens, "--arch" if args.arch else f"--profile {args.profile}: archs:")
    if not archs:
        raise UsageError("no target arch given; use --arch sm_90a (or all, native)")
    named = values.split_list(args.family, "--family") or list(prof.families)
    fams = values.resolve_families(named or sorted(families()))
    flags = {}
    if args.bits:
        flags["bits"] = values.int_list("--bits", args.bits)
    if args.dtypes:
        flags["dtypes"] = values.split_list(args.dtypes, "--dtypes")
    specs = {name: {**prof.families.get(name, {}), **flags} for name in fams}
    check_specs(fams, specs, flags, args.profile)
    return Plan(archs, specs, collect(fams, archs, specs, named, set(flags)))


def check_specs(fams: dict[str, Family], specs: dict[str, dict[str, Any]], flags: dict[str, Any],
                profile_path: str | None) -> None:
    """Against each family's Family.spec_keys: a profile's key must be one its family reads, and
    each value must be taken by some family it was given to (a dtype the others skip is fine:
    --dtypes float32 builds kbit's and skips moe's). A typo must not build nothing, or the
    whole default table, in silence."""
    for name, fam in fams.items():
        known = fam.spec_keys if fam.spec_keys is not None else specs[name]
        unknown = [k for k in specs[name] if k not in known and k not in flags]
        if unknown:  # flags go to every family, read or not: only a profile's keys are checked
            raise UsageError(f"--profile {profile_path}: families.{name}: unknown key "
                             f"{unknown[0]!r}; {name} reads {', '.join(known)}")
    given: dict[tuple[str, str], tuple[Any, list[str]]] = {}  # (key, value's JSON) -> families
    for name in fams:
        for key, vals in specs[name].items():
            for v in vals if isinstance(vals, list) else [vals]:
                v = tuple(v) if isinstance(v, list) else v  # a pair of formats
                given.setdefault((key, json.dumps(v, sort_keys=True)), (v, []))[1].append(name)
    for (key, _), (v, names) in given.items():
        takes = [fams[n].spec_keys for n in names]
        if any(t is None or t.get(key, ()) is None or v in t.get(key, ()) for t in takes):
            continue
        readers = [n for n in names if key in fams[n].spec_keys]
        accepted = list(dict.fromkeys(a for n in readers for a in fams[n].spec_keys[key]))
        where = (f"--{key} {_show(v)}" if key in flags else
                 f"--profile {profile_path}: families.{names[0]}.{key}: {_show(v)}")
        if not readers:
            raise UsageError(f"{where}: {', '.join(names)} read{'s' if len(names) == 1 else ''} "
                             f"no {key!r}")
        raise UsageError(f"{where}: not accepted by {', '.join(readers)} "
                         f"(accepted: {', '.join(map(_show, accepted))})")


def _show(v: Any) -> str:
    return json.dumps(list(v)) if isinstance(v, tuple) else str(v)


def collect(fams: dict[str, Family], archs: list[str], specs: dict[str, dict[str, Any]],
            named: Iterable[str] = (), flags: Iterable[str] = ()) -> list[KernelConfig]:
    """Every family's configs for `archs`, deduplicated, in the order the families yield them.

    A bad spec value (e.g. --bits 9) raises UnsupportedConfigError from the Config itself. A
    family the user named (`named`: --family or the profile's families) that yields nothing is
    a UsageError where it has no kernels for these archs (a family registered with `archs`) or
    where its own profile spec selects none of them (a format pair no arch of the run multiplies), as is a run
    of named families that builds nothing at all: `--check` would otherwise pass on a cache that
    holds none of their kernels. Shared flags (--bits, --dtypes) a named family does not take
    only skip it (--family kbit,moe --bits 5 builds kbit's 5-bit kernels).
    """
    configs: dict[KernelConfig, None] = {}
    named, shared = set(named), set(flags)
    for name, fam in fams.items():
        n = 0
        for cfg in fam.prewarm_configs(list(archs), specs[name]):
            configs.setdefault(cfg)
            n += 1
        if n or name not in named:
            continue
        has = [a for a in archs if fam.archs is None or a in fam.archs]
        own = {k: v for k, v in specs[name].items() if k not in shared}
        if not has:
            raise UsageError(f"family {name}: nothing to build for {', '.join(archs)}: it has "
                             f"kernels for {', '.join(fam.archs or ())} only")
        if own and not any(True for _ in fam.prewarm_configs(list(archs), own)):  # not the flags
            raise UsageError(f"family {name}: nothing to build for {', '.join(archs)}: its spec "
                             f"{json.dumps(own, sort_keys=True)} selects none of its kernels there")
    if named and not configs:
        raise UsageError(f"nothing to build: {', '.join(sorted(named))} yield no kernel for "
                         f"{', '.join(archs)} with these options")
    return list(configs)


# -- building ---------------------------------------------------------------------------------
def _init_worker(env: dict[str, str]) -> None:
    """Worker initializer: take the parent's KERNELGEN_* variables as they are now (a forkserver
    started earlier would otherwise keep the ones of its own start), and leave Ctrl-C to the
    parent, which stops the pool (a worker's KeyboardInterrupt would become a result, or kill it
    between tasks and break the pool)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in [n for n in os.environ if n.startswith("KERNELGEN_")]:
        if name not in env:
            del os.environ[name]
    os.environ.update(env)


def build_one(config: dict[str, Any]) -> Result:
    """Build one config (in a worker process): never raises, failures become a Result."""
    from kernelgen.core.config import config_from_dict
    from kernelgen.core.jit import build, default_cache
    from kernelgen.errors import CompileError

    t0 = time.perf_counter()
    short = str(config)
    try:
        cfg = config_from_dict(config)
        short = cfg.short()
        cache = default_cache()
        with warnings.catch_warnings():  # the summary names why once, not a warning per worker
            warnings.filterwarnings("ignore", UNSTORED_WARNING, RuntimeWarning)
            res = build(cfg, cache=cache, allow_jit=True)  # even where the server runs strict
        status, key, error = ("compiled" if res.compiled else "cached"), res.key, ""
        if res.entry is None:  # compiled, but the writable layer did not take it
            status, error = "unstored", cache.write_error or "the cache did not store it"
    except CompileError as e:
        status, key, error = "failed", "", e.log.strip() or str(e)
    except Exception as e:  # a worker must report, not die: the summary lists it
        status, key, error = "failed", "", f"{type(e).__name__}: {e}"
    return Result(config, short, status, time.perf_counter() - t0, key, error)


def _pool_context() -> multiprocessing.context.BaseContext:
    # fork is unsafe once CUDA or threads are around; forkserver starts workers cheaply.
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def build_all(configs: list[KernelConfig], jobs: int, on_done: Callable[[Result], None]) -> list[Result]:
    """Build `configs` with up to `jobs` processes (in this one if jobs == 1), in finish order."""
    dicts = [c.as_dict() for c in configs]
    results: list[Result] = []

    def done(r: Result) -> None:
        results.append(r)
        on_done(r)

    if jobs <= 1 or len(dicts) <= 1:
        for d in dicts:
            done(build_one(d))
        return results
    env = {k: v for k, v in os.environ.items() if k.startswith("KERNELGEN_")}
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(dicts)), mp_context=_pool_context(),
                               initializer=_init_worker, initargs=(env,))
    try:
        futures = {pool.submit(build_one, d): c for d, c in zip(dicts, configs, strict=True)}
        for fut in as_completed(futures):
            try:
                done(fut.result())
            except Exception as e:  # the worker process died (BrokenProcessPool, ...)
                cfg = futures[fut]
                done(Result(cfg.as_dict(), cfg.short(), "failed", 0.0, "", f"{type(e).__name__}: {e}"))
    except BaseException:  # Ctrl-C (or a failing on_done): stop now, not after the queue
        _stop(pool)
        raise
    pool.shutdown()
    return results


def _stop(pool: ProcessPoolExecutor) -> None:
    """Cancel what has not started and kill the workers: a half-built entry is only a private
    temp folder (publish renames complete ones), so nothing in the cache is left inconsistent.
    A second Ctrl-C meanwhile is ignored: the stop takes well under a second."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        workers = list((pool._processes or {}).values())  # no public way before Python 3.14
        pool.shutdown(wait=False, cancel_futures=True)
        for p in workers:
            p.terminate()
        for p in workers:  # (a second shutdown would wait for nothing: the first let go of
            p.join(5)      # the pool's manager thread; its futures end as BrokenProcessPool)
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)


class Progress:
    """`[ 12/53] compiled  0.21s  eta 4s  KbitQuantizeConfig(...)` on stderr per finished config."""

    def __init__(self, total: int, workers: int, quiet: bool):
        self.total, self.workers, self.quiet = total, max(1, workers), quiet
        self.done = 0
        self.busy = 0.0  # sum of per-config seconds

    def __call__(self, r: Result) -> None:
        self.done += 1
        self.busy += r.seconds
        if self.quiet:
            return
        left = self.total - self.done
        eta = self.busy / self.done * left / min(self.workers, max(left, 1))
        width = len(str(self.total))
        err(f"[{self.done:>{width}}/{self.total}] {r.status:<8} {r.seconds:5.2f}s  "
            f"eta {eta:3.0f}s  {r.short}")


# -- the command ------------------------------------------------------------------------------
def missing(configs: Iterable[KernelConfig]) -> list[KernelConfig]:
    """Configs in no cache layer. Renders (to compute the key) but never compiles."""
    from kernelgen.core.cache import key_of
    from kernelgen.core.jit import default_cache, key_parts

    cache = default_cache()
    return [c for c in configs if cache.load(key_of(key_parts(c)[0]), peek=True) is None]


def run_check(plan: Plan, args: argparse.Namespace) -> int:
    absent = missing(plan.configs)
    if args.json:
        print_json({"archs": plan.archs, "families": list(plan.specs), "total": len(plan.configs),
                    "present": len(plan.configs) - len(absent),
                    "missing": [c.as_dict() for c in absent]})
    else:
        for c in absent:
            print(f"missing  {c.short()}")
        print(f"check: {len(plan.configs)} configs for {','.join(plan.archs)} "
              f"({','.join(plan.specs)}): {len(plan.configs) - len(absent)} cached, "
              f"{len(absent)} missing")
    return 1 if absent else 0


def run(args: argparse.Namespace) -> int:
    plan = make_plan(args)
    if args.check:
        return run_check(plan, args)
    jobs = args.jobs if args.jobs is not None else (os.cpu_count() or 1)
    if jobs < 1:
        raise UsageError(f"-j {jobs}: expected at least 1 worker")
    workers = min(jobs, max(1, len(plan.configs)))
    if not args.quiet:
        err(f"prewarm: {len(plan.configs)} configs for {','.join(plan.archs)} "
            f"({','.join(plan.specs)}) with {workers} worker(s)")
    t0 = time.perf_counter()
    results = build_all(plan.configs, jobs, Progress(len(plan.configs), workers, args.quiet))
    seconds = time.perf_counter() - t0
    counts = {s: sum(r.status == s for r in results) for s in STATUSES}
    for r in results:
        if r.status == "failed":
            err(f"FAILED {r.short}")
            for line in [ln for ln in r.error.splitlines() if ln.strip()][:ERROR_LINES]:
                err(f"    {line}")
    unstored = [r.error for r in results if r.status == "unstored"]
    if unstored:  # one cache, one cause (the paths in it differ): --json has each
        err(f"NOT STORED {len(unstored)} compiled config(s): {unstored[0]}")
    if args.json:
        print_json({"archs": plan.archs, "families": list(plan.specs), "total": len(results),
                    **counts, "seconds": round(seconds, 3), "results": [asdict(r) for r in results]})
    else:
        lost = f", {counts['unstored']} not stored" if counts["unstored"] else ""
        print(f"prewarm: {counts['compiled']} compiled, {counts['cached']} already cached, "
              f"{counts['failed']} failed{lost} in {seconds:.1f}s")
    return 1 if counts["failed"] or counts["unstored"] else 0


def _keys_text() -> str:
    """The spec keys each registered family reads (Family.spec_keys), for --help."""
    lines = [f"  {name}: {', '.join(fam.spec_keys) if fam.spec_keys else '(any)'}"
             for name, fam in sorted(families().items())]
    return "\nprofile keys each family reads:\n" + "\n".join(lines) + "\n"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prewarm", help="compile ahead every config the dispatch can pick",
        description=__doc__, epilog=profile.__doc__ + _keys_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--arch", action="append", metavar="LIST",
                   help="targets, comma-separated: sm_80,sm_90a,... or all or native "
                        "(default: native with a GPU, else sm_90a)")
    p.add_argument("--family", action="append", metavar="LIST",
                   help="families to build, comma-separated (default: all registered)")
    p.add_argument("--profile", metavar="FILE.json", help="archs/families/specs file (format below)")
    p.add_argument("--bits", action="append", metavar="LIST", help="bit widths, e.g. 2,4")
    p.add_argument("--dtypes", action="append", metavar="LIST", help="e.g. float16,bfloat16")
    p.add_argument("-j", "--jobs", type=int, default=None, metavar="N",
                   help="parallel compile processes (default: CPU count)")
    p.add_argument("--check", action="store_true",
                   help="compile nothing; list configs missing from every cache layer, exit 1 if any")
    p.add_argument("--json", action="store_true", help="JSON summary on stdout")
    p.add_argument("--quiet", action="store_true", help="no per-config progress lines")
    p.set_defaults(func=run)
