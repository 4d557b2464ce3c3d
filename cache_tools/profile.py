"""Prewarm profile files: which archs, families and per-family specs to build.

Format (JSON; every key optional):

    {
      "archs": ["sm_90a"],
      "families": {
        "kbit": {"bits": [4], "dtypes": ["float16"]}
      }
    }

"archs" takes the same names as --arch (including "all" and "native"); --arch overrides it.
"families" names the families to build (--family narrows it) and holds one spec object per
family, handed untouched to that family's `prewarm_configs(archs, spec)`: each family reads its
own keys (listed below; e.g. kbit: "bits", "dtypes"; kbit_gemm / fp4_gemm "shapes": [[N, K] or
[M, N, K], ...]; moe "shapes": [[E, H, I, top_k], ...]). A key the family does not read, or a
value it does not take (a misspelled dtype, bits 7), is an error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import UsageError

KEYS = ("archs", "families")


@dataclass(frozen=True)
class Profile:
    archs: list[str] | None = None
    families: dict[str, dict[str, Any]] = field(default_factory=dict)


def load(path: str | Path) -> Profile:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise UsageError(f"--profile {path}: cannot read it ({e.strerror or e})") from None
    except ValueError as e:
        raise UsageError(f"--profile {path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise UsageError(f"--profile {path}: expected a JSON object with keys {KEYS}")
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise UsageError(f"--profile {path}: unknown keys {unknown}; expected {KEYS}")
    archs = data.get("archs")
    if archs is not None and (not isinstance(archs, list) or not archs
                              or not all(isinstance(a, str) for a in archs)):
        raise UsageError(f"--profile {path}: \"archs\" must be a non-empty list of names such as [\"sm_90a\"]")
    fams = data.get("families", {})
    if not isinstance(fams, dict) or not all(isinstance(s, dict) for s in fams.values()):
        raise UsageError(f"--profile {path}: \"families\" must map a family name to a spec "
                         f"object, e.g. {{\"kbit\": {{\"bits\": [4]}}}}")
    for fam, spec in fams.items():
        for key, value in spec.items():
            problem = _spec_value_problem(key, value)
            if problem:
                raise UsageError(f"--profile {path}: families.{fam}.{key}: {problem}")
    return Profile(archs=archs, families=fams)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _spec_value_problem(key: str, value: object) -> str:
    """'' if a family spec value has the form the tables take, else what is wrong."""
    if not isinstance(value, list):
        return f"must be a list, got {json.dumps(value)}"
    if key == "bits" and not all(_is_int(v) for v in value):
        return f"must be a list of integers such as [2, 4], got {json.dumps(value)}"
    if key == "dtypes" and not all(isinstance(v, str) for v in value):
        return f"must be a list of names such as [\"float16\"], got {json.dumps(value)}"
    if key == "shapes" and not all(isinstance(v, list) and all(_is_int(d) for d in v) for v in value):
        return f"must be a list of integer lists such as [[4096, 4096]], got {json.dumps(value)}"
    return ""
