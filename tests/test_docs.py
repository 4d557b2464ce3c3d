"""The README stays true to the code: every env knob documented, the CI runs its test command."""

from pathlib import Path

import pytest

from kernelgen import knobs

ROOT = Path(__file__).resolve().parents[1]


def test_every_knob_in_readme():
    readme = (ROOT / "README.md").read_text()
    missing = [k.name for k in knobs.KNOBS if f"`{k.name}`" not in readme]
    assert not missing, f"README env table lacks {missing}"


def test_ci_runs_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    cmd = 'pip install -e ".[test]" && python -m pytest -q'
    assert cmd in readme and cmd in ci


def test_every_package_is_packaged():
    """pyproject lists packages explicitly: a new family folder must be added there too."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for top in ("kernelgen", "cache_tools")
        for p in (ROOT / top).rglob("__init__.py")
    }
    assert found <= listed, f"add to pyproject [tool.setuptools] packages: {sorted(found - listed)}"


def test_no_top_level_name_hides_a_family_package():
    """`kernelgen.<family>` stays the package (a same-named export would shadow it and break
    `import kernelgen.<family>.select as S` and attribute access like kernelgen.fp4_gemm.prepare_weight)."""
    import importlib
    import pkgutil
    import types

    import kernelgen

    for mod in pkgutil.iter_modules(kernelgen.__path__):
        if mod.ispkg:
            importlib.import_module(f"kernelgen.{mod.name}")
            assert isinstance(getattr(kernelgen, mod.name), types.ModuleType), mod.name


def test_readme_names_every_target():
    from kernelgen.arch import ALL_ARCHS

    readme = (ROOT / "README.md").read_text()
    line = next((p for p in readme.split("\n\n") if p.startswith("Targets:")), "")
    missing = [a for a in ALL_ARCHS if f"`{a}`" not in line]
    assert line and not missing, f"README's 'Targets:' paragraph lacks {missing}"
