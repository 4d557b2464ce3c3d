"""Base of every kernel Config: frozen, validated, canonical JSON, printable.

A family subclasses `KernelConfig`, sets `family` and `template`, adds its fields (tile shape,
bits, dtypes, ...) and implements `symbols()` (the extern "C" kernels the template defines) and
`check()` (its own limits). The pipeline never looks inside beyond that.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from ..arch import get_arch
from ..errors import UnsupportedConfigError

_PLAIN = {"int": int, "str": str, "bool": bool}  # field annotations checked by validate()


@dataclass(frozen=True)
class KernelConfig:
    family: ClassVar[str] = ""
    template: ClassVar[str] = ""  # path under templates/, e.g. "kbit/quantize.cu.jinja"
    # Every entry point of every config's module starts with kg::grid_dependency_wait(), so
    # Ctx.launch launches them all with programmatic dependent launch (core/launch.py;
    # tests/core/test_launch.py checks every config `kernelgen prewarm` builds).

    arch: str

    def __post_init__(self) -> None:
        self.validate()

    # -- to override -------------------------------------------------------------------------
    def symbols(self) -> tuple[str, ...]:
        """Names of the extern "C" __global__ functions the rendered source defines."""
        raise NotImplementedError

    def check(self) -> None:
        """Family-specific limits; raise UnsupportedConfigError naming the field and rule."""

    def smem_bytes(self) -> int:
        """Dynamic shared memory per block the kernel needs (0 if none)."""
        return 0

    def smem_bytes_on(self, limit: int) -> int:
        """The dynamic shared memory to opt in to on a device whose blocks may have `limit` bytes
        (core/jit.py): smem_bytes(), which must fit it, unless the family's plans size their
        shared memory by the device's limit (then at most `limit`)."""
        return self.smem_bytes()

    def template_vars(self) -> dict[str, Any]:
        """Variables the template sees: every field, plus `cfg` itself."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["cfg"] = self
        return d

    # -- common ------------------------------------------------------------------------------
    def validate(self) -> None:
        for f in fields(self):  # 4.0 or numpy ints would render and hash differently from 4
            want = _PLAIN.get(f.type if isinstance(f.type, str) else getattr(f.type, "__name__", ""))
            value = getattr(self, f.name)
            if want is not None and type(value) is not want:
                raise UnsupportedConfigError(
                    f"{type(self).__name__}: {f.name}={value!r} is a {type(value).__name__}; "
                    f"expected a plain {want.__name__}"
                )
        arch = get_arch(self.arch)  # raises on an unknown arch
        self.check()
        smem = self.smem_bytes()
        if smem > arch.smem_optin:
            raise UnsupportedConfigError(
                f"{self!r}: needs {smem} B of shared memory per block, {arch.name} allows "
                f"{arch.smem_optin} B; use a smaller tile or fewer stages"
            )

    def as_dict(self) -> dict[str, Any]:
        d = {"family": self.family, "kind": type(self).__name__}
        d.update({f.name: getattr(self, f.name) for f in fields(self)})
        return d

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no whitespace (the cache key hashes the same dict)."""
        return json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))

    def replace(self, **changes: Any) -> KernelConfig:
        return dataclasses.replace(self, **changes)

    def short(self) -> str:
        """One-line human form: Kind(field=value, ...)."""
        inner = ", ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))
        return f"{type(self).__name__}({inner})"


def config_from_dict(d: dict[str, Any]) -> KernelConfig:
    """Inverse of `as_dict` for every registered Config class (used by the cache CLI)."""
    from .registry import config_classes

    d = dict(d)
    d.pop("family", None)
    kind = d.pop("kind")
    try:
        cls = config_classes()[kind]
    except KeyError:
        raise UnsupportedConfigError(f"unknown config kind {kind!r}") from None
    return cls(**d)
