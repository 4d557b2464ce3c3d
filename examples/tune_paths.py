"""Path crossovers of the quantized GEMMs on your own shapes: the default call against every path
forced, then how far the default is from the fastest.

    python examples/tune_paths.py measure --shapes 24576x1536,12288x4096 [--kinds kbit2,kbit4,nvfp4]
        [--ms 16,32,48,64,96,128,192,256] [--paths default,wgmma,dequant] --json paths.json
                                                                           (needs a GPU)
    python examples/tune_paths.py judge paths.json [more.json ...] [--show 0.03] [--replay]
                                                                           (CPU)

Kinds (KINDS): kbit2 / kbit3 / kbit5 / kbit4f, flat kbit weights (`gemm` paths gemv, mma,
dequant); kbit4, the tiled 4-bit default (gemv, tile, wgmma, dequant); nvfp4 / mxfp4
(`fp4_gemm`: gemv, tile, wgmma, dequant). measure: per (shape, kind, M) the default call and each
path forced with `path=`, fp16, median us of graph replays over weight copies rotated past L2; a
path the shape or M cannot take (an error before launch) is left out of the row. judge: for each
row the default's distance from the fastest forced path, the rows beyond --show, and the mean:
where the crossover tables (kbit_gemm/tc_select.py, kbit_gemm/tiled.py, fp4_gemm/select.py)
miss on those shapes (BENCHMARKS.md, session 34, found three that way). judge --replay: the
same, but scoring the path this checkout's selector picks for each row (that path's forced
time) instead of the default the row measured, so a rule change is checked against grids
measured before it without a GPU (session 35 fitted and checked its rules that way).
"""

from __future__ import annotations

import argparse
import json

KINDS: dict[str, tuple[str, ...]] = {
    "kbit2": ("gemv", "mma", "dequant"), "kbit3": ("gemv", "mma", "dequant"),
    "kbit5": ("gemv", "mma", "dequant"), "kbit4f": ("gemv", "mma", "dequant"),
    "kbit4": ("gemv", "tile", "wgmma", "dequant"),
    "nvfp4": ("gemv", "tile", "wgmma", "dequant"), "mxfp4": ("gemv", "tile", "wgmma", "dequant"),
}


def _weights(kind: str, n: int, k: int, l2_bytes: int):
    """(the GEMM function, weight copies spanning 8 x L2) for one kind."""
    import cupy
    import numpy as np
    from bench_fp4_gemm import weight_copies
    from bench_kbit_gemm import copies_of

    import kernelgen as kg
    from kernelgen.fp4_gemm import fp4_gemm

    if kind in ("nvfp4", "mxfp4"):
        return fp4_gemm, weight_copies(kind, n, k, l2_bytes)[0]
    bits = int(kind[4])
    w = cupy.asarray(np.random.default_rng(0).standard_normal((n, k), np.float32).astype(np.float16))
    lin = kg.quantize_weight(w, bits, layout="flat" if kind != "kbit4" else "tiled")
    del w
    wbytes = n * k * bits // 8 + n * k // 32
    return kg.gemm, copies_of(lin, max(2, -(-8 * l2_bytes // wbytes)))


def selection(kinds: str, paths: str | None) -> tuple[list[str], set[str] | None]:
    """The --kinds list and the --paths set (None: every path of each kind), checked."""
    kl = kinds.split(",")
    for kind in kl:
        if kind not in KINDS:
            raise SystemExit(f"--kinds: {kind!r}; expected some of {sorted(KINDS)}")
    if paths is None:
        return kl, None
    wanted, known = set(paths.split(",")), {"default"}.union(*(KINDS[kd] for kd in kl))
    if not wanted <= known:
        raise SystemExit(f"--paths: {sorted(wanted - known)}; expected some of {sorted(known)}")
    return kl, wanted


def measure(args: argparse.Namespace) -> None:
    kinds, wanted = selection(args.kinds, args.paths)  # before any GPU work
    import cupy
    import numpy as np

    from kernelgen.arch import device_info
    from kernelgen.bench import graph_time

    info = device_info()
    stream = cupy.cuda.Stream(non_blocking=True)
    stream.use()
    rows = []
    for shape in args.shapes.split(","):
        n, k = map(int, shape.split("x"))
        for kind in kinds:
            op, ws = _weights(kind, n, k, info.l2_bytes)
            for m in map(int, args.ms.split(",")):
                a = cupy.asarray(np.random.default_rng(m).standard_normal((m, k), np.float32)
                                 .astype(np.float16))
                us = {}
                for path in (None, *KINDS[kind]):
                    if wanted is not None and (path or "default") not in wanted:
                        continue
                    kw = {} if path is None else {"path": path}
                    try:
                        op(a, ws[0], **kw)  # compiles; refuses what this shape / M cannot take
                    except ValueError:
                        continue
                    t, _ = graph_time(lambda i, kw=kw, op=op, a=a, ws=ws: op(a, ws[i % len(ws)], **kw),
                                      len(ws), stream)
                    us[path or "default"] = t * 1e6
                rows.append(dict(n=n, k=k, kind=kind, m=m, arch=info.arch.name, sm_count=info.sm_count,
                                 us=us))
                print(_line(rows[-1]), flush=True)
            ws = None  # the copies go before the next kind's
            cupy.get_default_memory_pool().free_all_blocks()
            if args.json:  # after every (shape, kind): a run cut short keeps its rows
                with open(args.json, "w") as f:
                    json.dump(rows, f)


def pick(row: dict) -> str:
    """The path this checkout's selector picks for a measured row (its arch and SM count, fp16,
    the target's shared memory a block): what `judge --replay` scores instead of the default
    the row measured."""
    kind, m, n, k, arch, sms = (row[f] for f in ("kind", "m", "n", "k", "arch", "sm_count"))
    if kind in ("nvfp4", "mxfp4"):
        from kernelgen.fp4_gemm.select import plan
        return plan(arch, m, n, k, kind, "float16", sms).path
    if kind == "kbit4":
        from kernelgen.kbit_gemm.tiled import plan_tiled
        return plan_tiled(arch, m, n, k, "float16", sms).path
    from kernelgen.kbit_gemm.tc_select import plan_gemm
    return plan_gemm(arch, m, n, k, int(kind[4]), "float16", sms).path


def distance(row: dict, replay: bool = False) -> tuple[float, str] | None:
    """(default / fastest forced path - 1, that path) of a measured row; None without both.
    replay: the forced time of the path `pick` gives now in place of the measured default
    (None where that path was not timed)."""
    forced = {p: t for p, t in row["us"].items() if p != "default"}
    now = forced.get(pick(row)) if replay and forced else row["us"].get("default")
    if now is None or not forced:
        return None
    best = min(forced, key=forced.get)
    return now / forced[best] - 1, best


def _line(row: dict, replay: bool = False) -> str:
    d = distance(row, replay)
    paths = " ".join(f"{p} {t:.2f}" for p, t in row["us"].items() if p != "default")
    now = f"picks {pick(row)}" if replay else f"default {row['us'].get('default', float('nan')):.2f}"
    head = f"{row['n']}x{row['k']} {row['kind']} M={row['m']}: {now} | {paths}"
    return head if d is None else f"{head} | fastest {d[1]} ({100 * d[0]:+.1f}%)"


def judge(paths: list[str], show: float, replay: bool = False) -> None:
    dist = []
    for path in paths:
        with open(path) as f:
            for row in json.load(f):
                d = distance(row, replay)
                if d is None:
                    continue
                dist.append(max(d[0], 0.0))
                if d[0] > show:
                    print(_line(row, replay))
    if not dist:
        raise SystemExit("no row with the default (--replay: the picked path) and a forced path "
                         "in these files")
    who = "this checkout's pick" if replay else "the default"
    print(f"{len(dist)} rows: {who} is {100 * sum(dist) / len(dist):.2f}% from the fastest "
          f"path on average, {sum(d > show for d in dist)} rows beyond {100 * show:.0f}%, worst "
          f"{100 * max(dist):.1f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--shapes", required=True, help="NxK,NxK,...")
    m.add_argument("--kinds", default="kbit2,kbit3,kbit5,kbit4", help=f"some of {sorted(KINDS)}")
    m.add_argument("--ms", default="16,32,48,64,96,128,192,256")
    m.add_argument("--paths", help="time only these (default and / or forced paths), e.g. "
                   "default,wgmma,dequant; all the kind's paths when left out")
    m.add_argument("--json")
    j = sub.add_parser("judge")
    j.add_argument("paths", nargs="+")
    j.add_argument("--show", type=float, default=0.03, help="print rows this much slower (0.03: 3%%)")
    j.add_argument("--replay", action="store_true", help="score the path this checkout's selector "
                   "picks (its forced time) instead of the default measured: a rule change checked "
                   "against old grids without a GPU")
    args = ap.parse_args()
    if args.cmd == "measure":
        measure(args)
    else:
        judge(args.paths, args.show, args.replay)


if __name__ == "__main__":
    main()
