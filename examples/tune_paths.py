"""Path crossovers of the quantized GEMMs on your own shapes: the default call against every path
forced, then how far the default is from the fastest.

    python examples/tune_paths.py measure --shapes 24576x1536,12288x4096 [--kinds kbit2,kbit4,nvfp4]
        [--ms 16,32,48,64,96,128,192,256] [--paths default,wgmma,dequant] --json paths.json
                                                                           (needs a GPU)
    python examples/tune_paths.py judge paths.json [more.json ...] [--show 0.03]   (CPU)

Kinds (KINDS): kbit2 / kbit3 / kbit5 / kbit4f, flat kbit weights (`gemm` paths gemv, mma,
dequant); kbit4, the tiled 4-bit default (gemv, tile, wgmma, dequant); nvfp4 / mxfp4
(`fp4_gemm`: gemv, tile, wgmma, dequant). measure: per (shape, kind, M) the default call and each
path forced with `path=`, fp16, median us of graph replays over weight copies rotated past L2; a
path the shape or M cannot take (an error before launch) is left out of the row. judge: for each
row the default's distance from the fastest forced path, the rows beyond --show, and the mean:
where the crossover tables (kbit_gemm/tc_select.py, kbit_gemm/tiled.py, fp4_gemm/select.py)
miss on those shapes (BENCHMARKS.md, session 34, found three that way).
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


def distance(row: dict) -> tuple[float, str] | None:
    """(default / fastest forced path - 1, that path) of a measured row; None without both."""
    forced = {p: t for p, t in row["us"].items() if p != "default"}
    if "default" not in row["us"] or not forced:
        return None
    best = min(forced, key=forced.get)
    return row["us"]["default"] / forced[best] - 1, best


def _line(row: dict) -> str:
    d = distance(row)
    paths = " ".join(f"{p} {t:.2f}" for p, t in row["us"].items() if p != "default")
    head = f"{row['n']}x{row['k']} {row['kind']} M={row['m']}: default {row['us'].get('default', float('nan')):.2f} | {paths}"
    return head if d is None else f"{head} | fastest {d[1]} ({100 * d[0]:+.1f}%)"


def judge(paths: list[str], show: float) -> None:
    dist = []
    for path in paths:
        with open(path) as f:
            for row in json.load(f):
                d = distance(row)
                if d is None:
                    continue
                dist.append(max(d[0], 0.0))
                if d[0] > show:
                    print(_line(row))
    if not dist:
        raise SystemExit("no row with the default and a forced path in these files")
    print(f"{len(dist)} rows: the default is {100 * sum(dist) / len(dist):.2f}% from the fastest "
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
    args = ap.parse_args()
    if args.cmd == "measure":
        measure(args)
    else:
        judge(args.paths, args.show)


if __name__ == "__main__":
    main()
