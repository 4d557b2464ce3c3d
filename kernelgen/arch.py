"""Target architectures we compile for, and what each can do."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import DeviceError, UnsupportedConfigError


@dataclass(frozen=True)
class Arch:
    name: str  # NVRTC target, e.g. "sm_90a"
    cc: int  # compute capability as major*10+minor
    smem_optin: int  # max dynamic shared memory per block (bytes) after opt-in

    def __str__(self) -> str:
        return self.name


ARCHS: dict[str, Arch] = {
    a.name: a
    for a in (
        Arch("sm_80", 80, 163 * 1024),
        Arch("sm_90a", 90, 227 * 1024),
        Arch("sm_100a", 100, 227 * 1024),
        Arch("sm_120a", 120, 99 * 1024),
    )
}
ALL_ARCHS: tuple[str, ...] = tuple(ARCHS)


def get_arch(name: str) -> Arch:
    try:
        return ARCHS[name]
    except KeyError:
        raise UnsupportedConfigError(
            f"arch={name!r}: not a kernelgen target; choose one of {', '.join(ALL_ARCHS)}"
        ) from None


def arch_for_cc(major: int, minor: int) -> Arch:
    """The cubin target that runs on a device of compute capability major.minor.

    sm_80 SASS runs on every 8.x part; the 'a' targets run only on their exact part.
    """
    if major == 8:
        return ARCHS["sm_80"]
    table = {(9, 0): "sm_90a", (10, 0): "sm_100a", (12, 0): "sm_120a", (12, 1): "sm_120a"}
    if (major, minor) in table:
        return ARCHS[table[(major, minor)]]
    raise DeviceError(
        f"compute capability {major}.{minor} is not supported; kernelgen builds for "
        f"{', '.join(ALL_ARCHS)} (8.x, 9.0, 10.0, 12.x)"
    )


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    arch: Arch
    sm_count: int
    l2_bytes: int


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
        info = DeviceInfo(
            index=index,
            name=name.decode() if isinstance(name, bytes) else str(name),
            arch=arch_for_cc(props["major"], props["minor"]),
            sm_count=int(props["multiProcessorCount"]),
            l2_bytes=int(props.get("l2CacheSize", 0)),
        )
        _DEVICES[index] = info
    return info


def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False
