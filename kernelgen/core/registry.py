"""Kernel families register themselves here so the CLI can enumerate and rebuild their configs.

A family provides: its Config classes, and `prewarm_configs(archs, spec)` which yields exactly
the configs its selector can choose for the shapes in `spec` (the same tables the dispatch uses).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any

from .config import KernelConfig


@dataclass(frozen=True)
class Family:
    name: str
    config_classes: tuple[type[KernelConfig], ...]
    # (archs, spec) -> configs; spec is a dict from a profile file or CLI flags (may be empty)
    prewarm_configs: Callable[[Iterable[str], dict[str, Any]], Iterable[KernelConfig]]
    description: str = ""
    # targets the family has kernels for (None: every arch in kernelgen.arch.ALL_ARCHS); the
    # compile matrix checks prewarm yields configs for exactly these
    archs: tuple[str, ...] | None = None
    # the spec under which prewarm_configs also yields the configs a default prewarm leaves to
    # first use (the compile matrix and launch tests use it; kbit_gemm: the flat layout of 4-bit
    # weights, fp32 dequantize). Forced knobs (a path, split or tile for tuning) may still
    # compile others on first use.
    matrix_spec: dict[str, Any] | None = None
    # the spec keys prewarm_configs reads, each with the values it takes (None: any, the family
    # checks them); `kernelgen prewarm` refuses other keys and values no family of the run takes.
    # None: not declared, the spec goes through unchecked
    spec_keys: dict[str, tuple[Any, ...] | None] | None = None


_FAMILIES: dict[str, Family] = {}


# keys KernelConfig.as_dict puts beside the fields (config_from_dict reads the class from "kind")
RESERVED_FIELDS = frozenset({"family", "kind"})


def register_family(family: Family) -> Family:
    for cls in family.config_classes:
        clash = RESERVED_FIELDS & {f.name for f in fields(cls)}
        if clash:
            raise TypeError(f"{cls.__name__}: field(s) {sorted(clash)} would overwrite as_dict's "
                            "own keys (the cache key and config_from_dict read them); rename them")
    _FAMILIES[family.name] = family
    return family


def families() -> dict[str, Family]:
    _load_builtin()
    return dict(_FAMILIES)


def matrix_configs(archs: Iterable[str] | None = None) -> dict[str, list[KernelConfig]]:
    """Per family, every config its prewarm yields for each of `archs` (default: every target)
    with its matrix spec (Family.matrix_spec: what dispatch can launch beyond the prewarm
    default): the compile matrix of tests/core/test_compile_matrix.py."""
    from ..arch import ALL_ARCHS

    return {name: [cfg for arch in (ALL_ARCHS if archs is None else archs)
                   for cfg in fam.prewarm_configs([arch], fam.matrix_spec or {})]
            for name, fam in families().items()}


def config_classes() -> dict[str, type[KernelConfig]]:
    _load_builtin()
    return {c.__name__: c for f in _FAMILIES.values() for c in f.config_classes}


_NOT_FAMILIES = frozenset({"core"})


def _load_builtin() -> None:
    """Import every sub-package of kernelgen: a family package registers itself on import, so a
    new family needs no line here."""
    import importlib
    import pkgutil

    import kernelgen

    for mod in pkgutil.iter_modules(kernelgen.__path__):
        if mod.ispkg and mod.name not in _NOT_FAMILIES and not mod.name.startswith("_"):
            importlib.import_module(f"kernelgen.{mod.name}")
