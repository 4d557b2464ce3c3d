"""Target architectures we compile for, and what each can do."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

from .errors import DeviceError, UnsupportedConfigError


@dataclass(frozen=True)
class Arch:
    name: str  # NVRTC target, e.g. "sm_90a"
    cc: int  # compute capability as major*10+minor
    smem_optin: int  # max dynamic shared memory per block (bytes) after opt-in
    # a target whose instructions, limits and tuning tables this one shares (an 'a' cubin runs
    # only on its own part, so a part with the same features still needs a target of its own)
    like: str | None = None

    def __str__(self) -> str:
        return self.name


ARCHS: dict[str, Arch] = {
    a.name: a
    for a in (
        Arch("sm_80", 80, 163 * 1024),
        # Ada (L40S, RTX 4090, L4): sm_80's kernels and tables, but fp8 instructions (mx_gemm's
        # fp8 mma.sync) and 99 KB a block; an sm_89 cubin runs on 8.9 parts only
        Arch("sm_89", 89, 99 * 1024, like="sm_80"),
        Arch("sm_90a", 90, 227 * 1024),
        Arch("sm_100a", 100, 227 * 1024),
        Arch("sm_103a", 103, 227 * 1024, like="sm_100a"),  # B300 (Blackwell Ultra)
        Arch("sm_120a", 120, 99 * 1024),
        Arch("sm_121a", 121, 99 * 1024, like="sm_120a"),  # GB10 (DGX Spark)
    )
}
ALL_ARCHS: tuple[str, ...] = tuple(ARCHS)
_T = TypeVar("_T")


def base_of(name: str) -> str:
    """The target whose tables `name` shares (Arch.like), itself where none; unknown names as given."""
    a = ARCHS.get(name) if isinstance(name, str) else None
    return (a.like or a.name) if a else name


def per_target(table: dict[str, _T]) -> dict[str, _T]:
    """A table keyed by targets, extended to every target like one of them (ALL_ARCHS order);
    a like target's own entry wins over its base's. Keys must be targets."""
    unknown = sorted(set(table) - set(ARCHS))
    if unknown:
        raise ValueError(f"per_target: {unknown} are not targets ({', '.join(ALL_ARCHS)})")
    return {a: table[a] if a in table else table[base_of(a)] for a in ALL_ARCHS
            if a in table or base_of(a) in table}


def targets_like(*bases: str) -> tuple[str, ...]:
    """The targets whose base is one of `bases` (the bases included), in ALL_ARCHS order."""
    wrong = [b for b in bases if b not in ARCHS or ARCHS[b].like]
    if wrong:
        raise ValueError(f"targets_like: {wrong} are not base targets")
    return tuple(a for a in ALL_ARCHS if base_of(a) in bases)


KB = 1024
# Shared memory of an SM (bytes) that resident CTAs share, per target (smem_per_sm: per part).
SMEM_PER_SM: dict[str, int] = per_target({"sm_80": 164 * KB, "sm_89": 100 * KB, "sm_90a": 228 * KB,
                                          "sm_100a": 228 * KB, "sm_120a": 100 * KB})
# (SM count, shared memory a block may opt into) of the parts each target runs on, walked by the
# selectors' prewarm (a spec's "sm_counts" overrides the counts, see parts_of): A100 / A10 /
# A40 (8.6 runs the sm_80 target with 99 KB a block, 100 KB an SM); L40S / RTX 4090 / L4; H100
# SXM, H200 / H100 PCIe / H20; B200; B300 (148 SMs assumed, as B200: not measured); RTX 5090 /
# RTX PRO 6000 / 5080; GB10.
PARTS: dict[str, tuple[tuple[int, int], ...]] = {
    "sm_80": ((108, 163 * KB), (72, 99 * KB), (84, 99 * KB)),
    "sm_89": ((142, 99 * KB), (128, 99 * KB), (58, 99 * KB)),
    "sm_90a": ((132, 227 * KB), (114, 227 * KB), (78, 227 * KB)),
    "sm_100a": ((148, 227 * KB),),
    "sm_103a": ((148, 227 * KB),),
    "sm_120a": ((170, 99 * KB), (188, 99 * KB), (84, 99 * KB)),
    "sm_121a": ((48, 99 * KB),),
}
SM_COUNTS: dict[str, tuple[int, ...]] = {a: tuple(s for s, _ in p) for a, p in PARTS.items()}


def parts_of(arch: str, sm_counts: Iterable[int] | None = None) -> tuple[tuple[int, int], ...]:
    """(SM count, shared memory a block) of the parts a prewarm walks for `arch`: PARTS[arch],
    or each of a spec's `sm_counts` with every block limit the target's parts have (a count
    alone does not say which part: 8.x parts of 99 KB and 163 KB both run sm_80)."""
    if not sm_counts:
        return PARTS[arch]
    return tuple((s, lim) for s in sm_counts_of(sm_counts) for lim in smem_limits(arch))


def sm_counts_of(sm_counts: Iterable[int] | None) -> tuple[int, ...]:
    """A prewarm spec's "sm_counts" as ints, each >= 1; UnsupportedConfigError (what prewarm
    reports as a bad spec) naming one that is not."""
    try:
        counts = list(sm_counts or ())
    except TypeError:  # not a list
        counts = [sm_counts]
    out = []
    for s in counts:
        try:
            v = int(s)
        except (TypeError, ValueError):
            v = 0
        if v < 1:
            raise UnsupportedConfigError(f"spec sm_counts: {s!r}; expected SM counts, integers >= 1")
        out.append(v)
    return tuple(out)


def smem_limits(arch: str) -> tuple[int, ...]:
    """The shared memory a block of the target's parts may take, largest (the target's) first."""
    return tuple(sorted({lim for _, lim in PARTS[arch]}, reverse=True))


def smem_per_sm(arch: str, smem_limit: int | None = None) -> int:
    """Shared memory the resident CTAs of an SM share: the target's SMEM_PER_SM, or on a part
    whose blocks get less (`smem_limit`, the device's opt-in) that plus the 1 KB the driver keeps
    a block (every part: 8.6 / 8.9 and sm_120a 99 + 1 KB, A100 163 + 1, H100 227 + 1)."""
    per = SMEM_PER_SM[get_arch(arch).name]
    return per if smem_limit is None else min(per, smem_limit + KB)


def smem_cap(arch: str, smem_limit: int | None = None) -> int:
    """Shared memory a block may take: the target's opt-in, or the device's where lower."""
    cap = get_arch(arch).smem_optin
    return cap if smem_limit is None else min(cap, smem_limit)


def get_arch(name: str) -> Arch:
    try:
        return ARCHS[name]
    except (KeyError, TypeError):  # TypeError: an unhashable name (a list)
        raise UnsupportedConfigError(
            f"arch={name!r}: not a kernelgen target; choose one of {', '.join(ALL_ARCHS)}"
        ) from None


def arch_for_cc(major: int, minor: int) -> Arch:
    """The cubin target that runs on a device of compute capability major.minor.

    sm_89 on 8.9 parts (Ada), sm_80 SASS on every other 8.x part; the 'a' targets run only on
    their exact part.
    """
    if (major, minor) == (8, 9):
        return ARCHS["sm_89"]
    if major == 8:
        return ARCHS["sm_80"]
    exact = {divmod(a.cc, 10): a for a in ARCHS.values() if a.cc >= 90}
    if (major, minor) in exact:
        return exact[(major, minor)]
    ccs = ", ".join(["8.x", "8.9", *(f"{ma}.{mi}" for ma, mi in exact)])
    raise DeviceError(
        f"compute capability {major}.{minor} is not supported; kernelgen builds for "
        f"{', '.join(ALL_ARCHS)} ({ccs})"
    )


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    arch: Arch
    sm_count: int
    l2_bytes: int
    # shared memory (static + dynamic) a block may opt into on this part: below the target's
    # smem_optin on 8.6 parts (99 KB; A10, A40), which run the sm_80 target; None: the target's
    smem_optin: int | None = None


_DEVICES: dict[int, DeviceInfo] = {}


def device_info(index: int | None = None) -> DeviceInfo:
    """Properties of a CUDA device (the current one by default), memoised."""
    import cupy

    if index is None:
        index = cupy.cuda.runtime.getDevice()
    info = _DEVICES.get(index)
    if info is None:
        try:
            props = cupy.cuda.runtime.getDeviceProperties(index)
        except Exception as e:  # no driver / no device
            raise DeviceError(f"no usable CUDA device {index}: {e}") from e
        name = props["name"]
        arch = arch_for_cc(props["major"], props["minor"])
        info = DeviceInfo(
            index=index,
            name=name.decode() if isinstance(name, bytes) else str(name),
            arch=arch,
            sm_count=int(props["multiProcessorCount"]),
            l2_bytes=int(props.get("l2CacheSize", 0)),
            smem_optin=int(props.get("sharedMemPerBlockOptin", 0)) or arch.smem_optin,
        )
        _DEVICES[index] = info
    return info


def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False
