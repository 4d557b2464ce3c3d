"""`kernelgen cache explain`: would this config hit the cache, and if not, why? Never compiles.

    kernelgen cache explain --kind KbitQuantizeConfig --set bits=4 --set dtype=float16 --arch sm_90a
    kernelgen cache explain --config '{"kind": "KbitQuantizeConfig", "arch": "sm_90a", "bits": 4}'

The key is computed as a build would (render, header digests, NVRTC version, options) and
compared with the entries of the same config that exist: a changed header, another package or
NVRTC version, or other options are named. `--set` values: digits -> int, true/false -> bool,
anything else a string. Exit code 0 either way (see "hit": in --json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from kernelgen.core.cache import describe_miss, key_of
from kernelgen.core.config import KernelConfig
from kernelgen.core.jit import default_cache, key_parts
from kernelgen.core.registry import config_classes

from . import UsageError, values
from .table import print_json


def config_dict(args: argparse.Namespace) -> dict[str, Any]:
    """The config as a dict: --config JSON, then --kind / --arch / --set laid over it."""
    d: dict[str, Any] = {}
    if args.config:
        try:
            d = json.loads(args.config)
        except ValueError as e:
            raise UsageError(f"--config: not valid JSON ({e})") from None
        if not isinstance(d, dict):
            raise UsageError("--config: expected a JSON object such as {\"kind\": ..., \"arch\": ...}")
    if args.kind:
        d["kind"] = args.kind
    if not d.get("kind"):
        raise UsageError("explain needs the config: --kind NAME [--set FIELD=VALUE ...] or --config JSON")
    if args.arch is not None:  # a name, or native (this machine's GPU)
        archs = values.resolve_archs(values.split_list([args.arch], "--arch"))
        if len(archs) != 1:
            raise UsageError(f"--arch {args.arch!r}: explain takes one target")
        d["arch"] = archs[0]
    d.update(values.parse_sets(args.set))
    d.setdefault("arch", values.default_arch())
    return d


def make_config(d: dict[str, Any], family: str | None) -> KernelConfig:
    classes = config_classes()
    if family is not None:
        fams = values.resolve_families([family])
        classes = {c.__name__: c for c in fams[family].config_classes}
    kind = d.get("kind")
    if kind not in classes:
        where = f" of family {family!r}" if family else ""
        raise UsageError(f"--kind {kind!r}: not a config kind{where}; choose from {', '.join(sorted(classes))}")
    cls = classes[kind]
    if d.get("family", cls.family) != cls.family:
        raise UsageError(f"family {d['family']!r} does not match {kind} (family {cls.family!r})")
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - fields - {"kind", "family"})
    if unknown:
        raise UsageError(f"{kind} has no field(s) {', '.join(unknown)}; its fields: {', '.join(sorted(fields))}")
    return cls(**{k: v for k, v in d.items() if k in fields})  # validates: UnsupportedConfigError


def run(args: argparse.Namespace) -> int:
    family = values.split_list(args.family, "--family")
    if len(family) > 1:
        raise UsageError("--family: give one family for explain")
    cfg = make_config(config_dict(args), family[0] if family else None)
    parts, _ = key_parts(cfg)
    key = key_of(parts)
    lines = describe_miss(default_cache(), parts)
    hit = lines[0].startswith("hit")
    if args.json:
        print_json({"config": cfg.as_dict(), "key": key, "hit": hit, "lines": lines})
    else:
        print(f"config: {cfg.short()}\nkey:    {key}")
        print("\n".join(lines))
    return 0


def add_parser(csub: argparse._SubParsersAction) -> None:
    p = csub.add_parser("explain", help="why a config misses the cache (no compile)", description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", action="append", metavar="NAME", help="family the kind belongs to")
    p.add_argument("--kind", metavar="CLASS", help="Config class name, e.g. KbitQuantizeConfig")
    p.add_argument("--set", action="append", metavar="FIELD=VALUE", help="a config field (repeat)")
    p.add_argument("--arch", metavar="ARCH", help="target (default: native with a GPU, else sm_90a)")
    p.add_argument("--config", metavar="JSON", help="the whole config as JSON (KernelConfig.as_dict())")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)
