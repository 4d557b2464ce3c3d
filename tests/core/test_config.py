"""KernelConfig: validation names the field, JSON is canonical, as_dict round-trips."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import ClassVar

import pytest

from kernelgen.arch import ALL_ARCHS, ARCHS
from kernelgen.core.config import KernelConfig, config_from_dict
from kernelgen.core.registry import families
from kernelgen.errors import UnsupportedConfigError
from kernelgen.kbit.config import (
    E4M4Config,
    KbitDequantizeConfig,
    KbitQuantizeConfig,
    KbitRepackConfig,
)

PREWARM = list(families()["kbit"].prewarm_configs(["sm_90a"], {}))


@pytest.mark.parametrize(
    "cls, kwargs, field",
    [
        (E4M4Config, {"arch": "sm_75"}, "arch"),
        (KbitQuantizeConfig, {"arch": "sm_90"}, "arch"),  # sm_90 is not sm_90a
        (KbitQuantizeConfig, {"arch": "sm_90a", "bits": 1}, "bits"),
        (KbitQuantizeConfig, {"arch": "sm_90a", "bits": 6}, "bits"),
        (KbitDequantizeConfig, {"arch": "sm_80", "bits": 8}, "bits"),
        (KbitRepackConfig, {"arch": "sm_80", "bits": 0}, "bits"),
        (KbitQuantizeConfig, {"arch": "sm_90a", "dtype": "float64"}, "dtype"),
        (KbitQuantizeConfig, {"arch": "sm_90a", "dtype": "int8"}, "dtype"),
        (KbitDequantizeConfig, {"arch": "sm_90a", "dtype": "half"}, "dtype"),
        (KbitDequantizeConfig, {"arch": "sm_90a", "absmax_dtype": "bfloat16"}, "absmax_dtype"),
        (KbitRepackConfig, {"arch": "sm_90a", "tile_n": 96}, "tile_n"),
        (KbitRepackConfig, {"arch": "sm_90a", "tile_k": 16}, "tile_k"),
    ],
)
def test_validate_rejects_and_names_the_field(cls, kwargs, field):
    with pytest.raises(UnsupportedConfigError) as exc:
        cls(**kwargs)
    msg = str(exc.value)
    assert f"{field}=" in msg, f"{cls.__name__}({kwargs}): message does not name {field}: {msg}"
    assert repr(kwargs[field]) in msg or str(kwargs[field]) in msg, (
        f"{cls.__name__}({kwargs}): message does not give the value: {msg}")


def test_validate_rejects_on_replace():
    """A config cannot become invalid through replace(): validation runs on every construction."""
    cfg = KbitQuantizeConfig(arch="sm_90a", bits=4)
    with pytest.raises(UnsupportedConfigError, match="bits=7"):
        cfg.replace(bits=7)


@pytest.mark.parametrize("arch", ALL_ARCHS)
@pytest.mark.parametrize("bits", [2, 3, 4, 5])
def test_valid_configs_construct(arch, bits):
    cfg = KbitQuantizeConfig(arch=arch, bits=bits, dtype="bfloat16")
    assert (cfg.arch, cfg.bits, cfg.dtype) == (arch, bits, "bfloat16"), cfg


@pytest.mark.parametrize("cfg", PREWARM, ids=lambda c: c.short())
def test_to_json_canonical(cfg):
    twin = type(cfg)(**{k: v for k, v in cfg.as_dict().items() if k not in ("family", "kind")})
    assert twin == cfg and twin is not cfg
    assert twin.to_json() == cfg.to_json(), cfg
    text = cfg.to_json()
    assert " " not in text and "\n" not in text, f"{cfg}: not compact: {text}"
    keys = list(json.loads(text))
    assert keys == sorted(keys), f"{cfg}: keys not sorted: {keys}"
    assert json.loads(text) == cfg.as_dict(), cfg


def test_to_json_distinguishes_configs():
    texts = [c.to_json() for c in PREWARM]
    assert len(set(texts)) == len(texts) == len(set(PREWARM)), "two prewarm configs share a JSON"


def test_to_json_names_kind_and_family():
    # Two classes with the same fields must not collide (E4M4Config has only `arch`).
    d = json.loads(E4M4Config(arch="sm_80").to_json())
    assert d == {"arch": "sm_80", "family": "kbit", "kind": "E4M4Config"}


@pytest.mark.parametrize("cfg", PREWARM, ids=lambda c: c.short())
def test_config_from_dict_round_trip(cfg):
    back = config_from_dict(cfg.as_dict())
    assert back == cfg and type(back) is type(cfg), f"{cfg} -> {back}"
    assert back.to_json() == cfg.to_json(), cfg
    # and through JSON text, as the cache CLI reads manifests
    assert config_from_dict(json.loads(cfg.to_json())) == cfg, cfg


@pytest.mark.parametrize("family", sorted(families()))
def test_every_prewarm_config_round_trips(family):
    """What `kernelgen prewarm` hands its workers and the cache CLI reads back: every config a
    family's prewarm yields for any arch (a config field named "kind" once overwrote the class
    name, so the sm_120a block-scaled configs could not be rebuilt from their dicts)."""
    fam = families()[family]
    cfgs = [c for arch in ALL_ARCHS if fam.archs is None or arch in fam.archs
            for c in fam.prewarm_configs([arch], fam.matrix_spec or {})]
    assert cfgs
    for cfg in cfgs:
        back = config_from_dict(json.loads(cfg.to_json()))
        assert back == cfg and type(back) is type(cfg), f"{cfg} -> {back}"


def test_a_field_named_like_as_dicts_keys_is_refused():
    from kernelgen.core.registry import Family, register_family

    @dataclass(frozen=True)
    class Clash(KernelConfig):
        family: ClassVar[str] = "clash"
        kind: str = "x"

    @dataclass(frozen=True, kw_only=True)  # kw_only: the base declares family before arch
    class Clash2(KernelConfig):
        family: str = "clash"  # an instance field, not the ClassVar

    for cls, name in ((Clash, "kind"), (Clash2, "family")):
        with pytest.raises(TypeError, match=rf"{cls.__name__}: field\(s\) \['{name}'\]"):
            register_family(Family(name="clash", config_classes=(cls,), prewarm_configs=lambda a, s: ()))
    assert "clash" not in families()


def test_config_from_dict_unknown_kind():
    with pytest.raises(UnsupportedConfigError, match="NoSuchConfig"):
        config_from_dict({"family": "kbit", "kind": "NoSuchConfig", "arch": "sm_90a"})


def test_config_from_dict_validates():
    d = KbitQuantizeConfig(arch="sm_90a").as_dict() | {"bits": 9}
    with pytest.raises(UnsupportedConfigError, match="bits=9"):
        config_from_dict(d)


@dataclass(frozen=True)
class _SmemConfig(KernelConfig):
    """Test-only family: asks for `smem` bytes of dynamic shared memory."""

    family: ClassVar[str] = "test"
    template: ClassVar[str] = "test/none.cu.jinja"
    smem: int = 0

    def symbols(self) -> tuple[str, ...]:
        return ("k",)

    def smem_bytes(self) -> int:
        return self.smem


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_smem_limit(arch):
    limit = ARCHS[arch].smem_optin
    ok = _SmemConfig(arch=arch, smem=limit)  # exactly the limit is allowed
    assert ok.smem_bytes() == limit
    with pytest.raises(UnsupportedConfigError) as exc:
        _SmemConfig(arch=arch, smem=limit + 1)
    msg = str(exc.value)
    assert str(limit + 1) in msg and str(limit) in msg and arch in msg, f"{arch}: {msg}"


def test_smem_limit_is_per_arch():
    # 128 KiB fits sm_90a (227 KiB) but not sm_120a (99 KiB)
    _SmemConfig(arch="sm_90a", smem=128 * 1024)
    with pytest.raises(UnsupportedConfigError, match="sm_120a"):
        _SmemConfig(arch="sm_120a", smem=128 * 1024)


@pytest.mark.parametrize("cfg", PREWARM, ids=lambda c: c.short())
def test_short_names_every_field(cfg):
    s = cfg.short()
    assert s.startswith(type(cfg).__name__ + "("), s
    for k, v in cfg.as_dict().items():
        if k not in ("family", "kind"):
            assert f"{k}={v}" in s, f"{cfg}: short() lacks {k}: {s}"


@pytest.mark.parametrize("name", ["sm_75", ["sm_90a"], None])
def test_unknown_arch_is_a_config_error(name):
    """get_arch and the shared-memory helpers the planners call name the arch (an unhashable
    name was a TypeError, smem_per_sm's unknown one a KeyError)."""
    from kernelgen.arch import get_arch, smem_per_sm

    for fn in (get_arch, smem_per_sm):
        with pytest.raises(UnsupportedConfigError, match=r"arch=.*not a kernelgen target"):
            fn(name)


@pytest.mark.parametrize("cc,target", [((8, 0), "sm_80"), ((8, 6), "sm_80"), ((8, 7), "sm_80"), ((8, 9), "sm_89"),
                                       ((9, 0), "sm_90a"), ((10, 0), "sm_100a"), ((10, 3), "sm_103a"),
                                       ((12, 0), "sm_120a"), ((12, 1), "sm_121a")])
def test_device_targets(cc, target):
    """Each compute capability gets the cubin target that runs on it: an 'a' cubin runs only on
    its exact part, so B300 (10.3) and GB10 (12.1) have targets of their own."""
    from kernelgen.arch import arch_for_cc

    assert arch_for_cc(*cc).name == target


# families with tables of their own for a like target (the rest plan as on its base)
# (None: all of the family's; else which of the base's configs the like target also takes)
OWN_TABLES = {"sm_89": {"mx_gemm": None,  # Ada's fp8 mma.sync
                        "fp4_gemm": lambda c: getattr(c, "warps_per_sm", 16) != 32}}  # GEMV_WPS32_ARCH


@pytest.mark.parametrize("arch", [a for a in ALL_ARCHS if ARCHS[a].like])
def test_a_target_like_another_plans_as_it_does(arch, monkeypatch):
    """sm_103a / sm_121a share sm_100a's / sm_120a's limits and tables (Arch.like), sm_89
    sm_80's tables (not its limits: 99 KB a block): on a part of the same SM count and shared
    memory every family's prewarm walk yields the base's configs, arch aside, but for the
    families with tables of their own there (OWN_TABLES)."""
    import dataclasses

    from kernelgen import arch as A

    base = A.base_of(arch)
    assert base != arch and ARCHS[base].like is None
    assert A.PARTS[arch]
    if arch == "sm_89":  # the base's walk on the like target's parts
        assert A.smem_limits(arch) == (99 * 1024,) and A.SMEM_PER_SM[arch] == 100 * 1024
        monkeypatch.setitem(A.PARTS, base, A.PARTS[arch])
    else:
        assert ARCHS[arch].smem_optin == ARCHS[base].smem_optin
        assert A.SMEM_PER_SM[arch] == A.SMEM_PER_SM[base] and A.smem_limits(arch) == A.smem_limits(base)
    PARTS = A.PARTS
    for name, fam in families().items():
        own = OWN_TABLES.get(arch, {})
        if name in own and own[name] is None:
            continue
        keep = own.get(name) or (lambda c: True)
        if fam.archs is not None:
            assert (arch in fam.archs) == (base in fam.archs), name
            if base not in fam.archs:
                continue
        spec = dict(fam.matrix_spec or {})
        if "sm_counts" in (fam.spec_keys or {}):
            spec["sm_counts"] = [PARTS[base][0][0]]
        mine = {dataclasses.replace(c, arch=base) for c in fam.prewarm_configs([arch], spec)}
        assert mine and mine == {c for c in fam.prewarm_configs([base], spec) if keep(c)}, name


@pytest.mark.parametrize("cc", [(7, 5), (9, 1), (11, 0), (12, 2)])
def test_unsupported_device_is_a_device_error(cc):
    from kernelgen.arch import arch_for_cc
    from kernelgen.errors import DeviceError

    with pytest.raises(DeviceError, match=re.escape(f"compute capability {cc[0]}.{cc[1]} is not supported")) as e:
        arch_for_cc(*cc)
    for a in ARCHS.values():  # the message names every target and the capabilities it runs on
        assert a.name in str(e.value)
        assert (f"{a.cc // 10}.{a.cc % 10}" if a.cc != 80 else "8.x") in str(e.value)


def test_per_target_tables():
    from kernelgen.arch import base_of, per_target, targets_like

    assert base_of("sm_121a") == "sm_120a" and base_of("sm_90a") == "sm_90a"
    assert per_target({"sm_100a": 1, "sm_120a": 2}) == {"sm_100a": 1, "sm_103a": 1, "sm_120a": 2, "sm_121a": 2}
    # a like target's own entry wins; a table without the base has only the like target's entry
    assert per_target({"sm_100a": 1, "sm_103a": 3}) == {"sm_100a": 1, "sm_103a": 3}
    assert per_target({"sm_103a": 3}) == {"sm_103a": 3}
    with pytest.raises(ValueError, match=r"\['sm_90'\] are not targets"):
        per_target({"sm_90": 1})
    assert targets_like("sm_90a", "sm_120a") == ("sm_90a", "sm_120a", "sm_121a")
    with pytest.raises(ValueError, match="not base targets"):
        targets_like("sm_121a")
