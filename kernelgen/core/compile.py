"""NVRTC: rendered source -> cubin for an explicit target. Needs no GPU and no driver.

Options are built here and only here. Project headers travel in memory (see render.py); the CUDA
toolkit headers come from the pip `cuda-toolkit` wheels (or a local toolkit), located with
`cuda.pathfinder`. The options that change code generation are part of the cache key; include
paths are not (they are absolute and machine-specific).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import CompileError, KernelgenError
from .config import KernelConfig
from .render import Rendered

# Options that affect the generated code. Changing this tuple changes every cache key.
BASE_OPTIONS: tuple[str, ...] = (
    "-std=c++17",
    "-lineinfo",  # source lines in SASS for ncu; no effect on speed
    "--ptxas-options=-v",  # resource report (registers, spills, smem) into the log
    "-DKERNELGEN_JIT=1",
)


def codegen_options(arch: str) -> list[str]:
    """The options that define the binary; these enter the cache key."""
    return [*BASE_OPTIONS, f"--gpu-architecture={arch}"]


@functools.lru_cache(maxsize=1)
def cuda_include_dir() -> Path:
    """Directory holding cuda_fp16.h / cuda_bf16.h / cuda_runtime.h."""
    errors = []
    try:
        import cuda.pathfinder as pf

        found = pf.find_nvidia_header_directory("cudart")
        if found and (Path(found) / "cuda_fp16.h").is_file():
            return Path(found)
        get_home = getattr(pf, "get_cuda_path_or_home", None)  # not public in every release
        home = get_home() if get_home else (os.environ.get("CUDA_PATH") or os.environ.get("CUDA_HOME"))
        if home and (Path(home) / "include" / "cuda_fp16.h").is_file():
            return Path(home) / "include"
    except Exception as e:  # pathfinder missing or too old
        errors.append(str(e))
    raise KernelgenError(
        "CUDA headers (cuda_fp16.h) not found. Install them with "
        "`pip install \"cuda-toolkit[nvrtc,cudart]==13.*\"` or set CUDA_PATH to a toolkit. "
        + "; ".join(errors)
    )


# The toolkit headers our templates include; their bytes enter the cache key, so a cudart
# headers upgrade without an NVRTC upgrade still misses.
TOOLKIT_HEADERS = ("cuda_fp16.h", "cuda_fp16.hpp", "cuda_bf16.h", "cuda_bf16.hpp")


@functools.lru_cache(maxsize=1)
def toolkit_headers_digest() -> str:
    h = hashlib.sha256()
    for name in TOOLKIT_HEADERS:
        path = cuda_include_dir() / name
        h.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"(absent)"))
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def nvrtc_version() -> str:
    from cupy_backends.cuda.libs import nvrtc

    major, minor = nvrtc.getVersion()
    return f"{major}.{minor}"


@dataclass(frozen=True)
class Compiled:
    cubin: bytes
    log: str
    seconds: float


_RESOURCE = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_STATIC_SMEM = re.compile(r"(\d+) bytes smem")


def resource_summary(log: str) -> dict[str, int | None]:
    """Registers, spill bytes and static shared memory (max over kernels) from the ptxas -v
    report.

    None when the log holds no report: NVRTC 13.0 was seen to drop it, and "no report" must
    not read as "no spills".
    """
    regs = [int(m) for m in _RESOURCE.findall(log)]
    spills = [int(a) + int(b) for a, b in _SPILL.findall(log)]
    if not regs:
        return {"registers": None, "spill_bytes": None, "static_smem": None}
    return {"registers": max(regs), "spill_bytes": max(spills, default=0),
            "static_smem": max((int(m) for m in _STATIC_SMEM.findall(log)), default=0)}


def compile_cubin(config: KernelConfig, rendered: Rendered) -> Compiled:
    """Compile `rendered` for `config.arch`. Raises CompileError with the log and source."""
    from cupy_backends.cuda.libs import nvrtc

    options = [*codegen_options(config.arch), f"-I{cuda_include_dir()}"]
    names = [n for n, _ in rendered.headers]
    texts = [t for _, t in rendered.headers]
    t0 = time.perf_counter()
    prog = nvrtc.createProgram(
        rendered.source, rendered.name, [t.encode() for t in texts], [n.encode() for n in names]
    )
    try:
        try:
            nvrtc.compileProgram(prog, options)
        except nvrtc.NVRTCError:
            raise CompileError(
                config, nvrtc.getProgramLog(prog).rstrip("\x00"), rendered.source, options
            ) from None
        log = nvrtc.getProgramLog(prog).rstrip("\x00")
        cubin = _get_cubin(prog)
    finally:
        nvrtc.destroyProgram(prog)
    return Compiled(cubin=cubin, log=log, seconds=time.perf_counter() - t0)


@functools.lru_cache(maxsize=1)
def _nvrtc_lib() -> ctypes.CDLL:
    """The libnvrtc CuPy loaded (found in this process's mappings; dlopen hands back the same
    handle)."""
    with open("/proc/self/maps") as f:
        paths = [ln.split()[-1] for ln in f if "libnvrtc.so" in ln and "builtins" not in ln]
    if not paths:
        raise OSError("libnvrtc is not mapped into this process")
    return ctypes.CDLL(paths[0])


def _get_cubin(prog: int) -> bytes:
    """The whole cubin: CuPy's getCUBIN returns the image one byte short (it sizes it as a
    C string), which the driver tolerates but nvdisasm / cuobjdump reject."""
    from cupy_backends.cuda.libs import nvrtc

    try:
        lib = _nvrtc_lib()
    except OSError:  # not Linux, or an unusual loader: the short image still loads
        return bytes(nvrtc.getCUBIN(prog))
    size = ctypes.c_size_t()
    if lib.nvrtcGetCUBINSize(ctypes.c_void_p(prog), ctypes.byref(size)) != 0:
        return bytes(nvrtc.getCUBIN(prog))
    buf = ctypes.create_string_buffer(size.value)
    if lib.nvrtcGetCUBIN(ctypes.c_void_p(prog), buf) != 0:
        return bytes(nvrtc.getCUBIN(prog))
    return buf.raw
