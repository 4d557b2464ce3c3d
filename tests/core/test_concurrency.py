"""Several processes, one cache: each kernel compiled once, a killed compiler blocks nobody.

Workers are real processes (multiprocessing "spawn": nothing inherited but the environment),
started together on a barrier so that they race for the same keys.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import filelock
import pytest

from kernelgen.core.cache import CUBIN, MANIFEST, DiskCache, key_of
from kernelgen.core.jit import build, key_parts
from kernelgen.errors import CacheLockTimeout
from kernelgen.kbit.config import E4M4Config, KbitDequantizeConfig, KbitQuantizeConfig

N_PROCS = 8
CONFIGS = [
    E4M4Config(arch="sm_90a"),
    KbitQuantizeConfig(arch="sm_90a", bits=4, dtype="float16"),
    KbitQuantizeConfig(arch="sm_80", bits=3, dtype="bfloat16"),
    KbitDequantizeConfig(arch="sm_120a", bits=2, dtype="float32", absmax_dtype="e4m4"),
]
HOLDER_CFG = E4M4Config(arch="sm_100a")

_ctx = mp.get_context("spawn")


# -- workers (top level: spawn imports them by name) --------------------------------------------

def _race_worker(index: int, cache_dir: str, cfg_dicts: list[dict], barrier, out: str) -> None:
    from kernelgen.core.config import config_from_dict
    from kernelgen.core.jit import build, key_parts

    os.environ["KERNELGEN_CACHE_DIR"] = cache_dir
    cfgs = [config_from_dict(d) for d in cfg_dicts]
    for c in cfgs:  # render + NVRTC load before the barrier: the race is on compile + publish
        key_parts(c)
    # rotate the order: each kernel is asked for first by two processes at once
    order = cfgs[index % len(cfgs):] + cfgs[: index % len(cfgs)]
    barrier.wait(timeout=60)
    results = []
    for c in order:
        r = build(c)
        results.append({"key": r.key, "compiled": r.compiled,
                        "sha": hashlib.sha256(r.cubin).hexdigest(), "config": c.short()})
    Path(out).write_text(json.dumps(results))


def _holder_worker(cache_dir: str, cfg_dict: dict, ready, partial: bool) -> None:
    """Take the key's lock through the real build path and stop inside the compile."""
    from kernelgen.core.config import config_from_dict
    from kernelgen.core.jit import build, default_cache

    os.environ["KERNELGEN_CACHE_DIR"] = cache_dir
    cfg = config_from_dict(cfg_dict)

    def stall(_cfg):
        if partial:  # as if killed while writing its private build folder
            tmp = default_cache().root / "v1" / "tmp" / "deadbeef0000-partial"
            tmp.mkdir(parents=True)
            (tmp / CUBIN).write_bytes(b"\x7fELF half")
        ready.set()
        time.sleep(120)

    build(cfg, before_compile=stall)


# -- helpers ------------------------------------------------------------------------------------

def _start_holder(cache_env: Path, partial: bool):
    ready = _ctx.Event()
    proc = _ctx.Process(target=_holder_worker,
                        args=(str(cache_env), HOLDER_CFG.as_dict(), ready, partial), daemon=True)
    proc.start()
    assert ready.wait(60), "holder process did not reach the compile"
    key = key_of(key_parts(HOLDER_CFG)[0])
    probe = filelock.FileLock(str(DiskCache().lock_path(key)), timeout=0)
    with pytest.raises(filelock.Timeout):  # the simulation holds the real lock
        probe.acquire()
    return proc, key


def _kill(proc) -> None:
    if proc.is_alive():
        os.kill(proc.pid, signal.SIGKILL)
    proc.join(30)
    assert not proc.is_alive()


# -- tests --------------------------------------------------------------------------------------

def test_race_compiles_each_kernel_once(cache_env, tmp_path):
    barrier = _ctx.Barrier(N_PROCS)
    outs = [tmp_path / f"worker{i}.json" for i in range(N_PROCS)]
    procs = [
        _ctx.Process(target=_race_worker,
                     args=(i, str(cache_env), [c.as_dict() for c in CONFIGS], barrier, str(outs[i])))
        for i in range(N_PROCS)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
    for p in procs:
        if p.is_alive():
            _kill(p)
    assert [p.exitcode for p in procs] == [0] * N_PROCS, "a worker failed"
    results = [r for o in outs for r in json.loads(o.read_text())]
    assert len(results) == N_PROCS * len(CONFIGS)
    keys = {key_of(key_parts(c)[0]): c.short() for c in CONFIGS}
    for key, cfg in keys.items():
        mine = [r for r in results if r["key"] == key]
        assert len(mine) == N_PROCS, cfg
        compiled = sum(r["compiled"] for r in mine)
        assert compiled == 1, f"{cfg}: compiled {compiled} times across {N_PROCS} processes"
        shas = {r["sha"] for r in mine}
        assert len(shas) == 1, f"{cfg}: processes got different cubins"
        entry = cache_env / "v1" / key[:2] / key
        assert hashlib.sha256((entry / CUBIN).read_bytes()).hexdigest() in shas, cfg
    cache = DiskCache()
    assert sorted(e.key for e in cache.entries()) == sorted(keys)
    assert cache.verify() == []
    assert list((cache_env / "v1" / "tmp").iterdir()) == [], "build folders left behind"


@pytest.mark.parametrize("partial", [False, True], ids=["in-compile", "partial-folder"])
def test_killed_holder_blocks_nobody(partial, cache_env, monkeypatch):
    monkeypatch.setenv("KERNELGEN_LOCK_TIMEOUT", "30")  # a stuck lock fails instead of hanging
    proc, key = _start_holder(cache_env, partial)
    _kill(proc)
    entry = cache_env / "v1" / key[:2] / key
    assert not entry.exists(), "the killed process left an entry"
    t0 = time.monotonic()
    res = build(HOLDER_CFG)
    elapsed = time.monotonic() - t0
    assert elapsed < 10, f"build after the holder died took {elapsed:.1f}s"
    assert res.compiled and res.key == key and res.entry.path == entry
    manifest = json.loads((entry / MANIFEST).read_text())
    assert manifest["cubin_sha256"] == hashlib.sha256(res.cubin).hexdigest()
    leftovers = list((cache_env / "v1" / "tmp").iterdir())
    assert len(leftovers) == int(partial), leftovers
    if leftovers:  # a dead build folder goes with the next gc once it is old
        old = time.time() - 2 * 3600
        os.utime(leftovers[0], (old, old))
        DiskCache().gc(max_bytes=1 << 40)
        assert list((cache_env / "v1" / "tmp").iterdir()) == []
        assert entry.is_dir(), "gc removed the live entry"


def test_lock_timeout(cache_env, monkeypatch):
    proc, key = _start_holder(cache_env, partial=False)
    try:
        monkeypatch.setenv("KERNELGEN_LOCK_TIMEOUT", "1")
        t0 = time.monotonic()
        with pytest.raises(CacheLockTimeout) as exc:
            build(HOLDER_CFG)
        elapsed = time.monotonic() - t0
    finally:
        _kill(proc)
    msg = str(exc.value)
    assert 0.9 < elapsed < 10, elapsed
    assert HOLDER_CFG.short() in msg, msg
    assert "KERNELGEN_LOCK_TIMEOUT" in msg and "KERNELGEN_CACHE_DIR" in msg, msg
    assert key in msg, msg  # the lock file's path
    # once the holder is gone, the same call succeeds
    assert build(HOLDER_CFG).compiled is True
