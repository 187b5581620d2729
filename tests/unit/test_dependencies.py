"""One source of truth for versions: pyproject.toml's ranges, requirements/lock.txt's tested set inside them, the
Bento's pins equal to the lock, and every package handoff imports declared."""

from __future__ import annotations

import ast
import importlib.metadata
import sys
from pathlib import Path

import tomllib
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("contract", "train", "export", "serve")


def declared() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {canonicalize_name(r.name): r for r in map(Requirement, project["dependencies"])}


def optional() -> dict[str, Requirement]:
    """The extras a user installs for one path (`text`: transformers, for a Hugging Face export)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return {
        canonicalize_name(r.name): r for name, rows in extras.items() if name != "dev" for r in map(Requirement, rows)
    }


def locked() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "requirements/lock.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = Version(version.strip())
    return pins


def test_the_lock_pins_every_dependency_inside_its_range():
    pins = locked()
    for name, requirement in declared().items():
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        assert name in pins, f"{name} is a dependency but requirements/lock.txt does not pin it"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{name}=={pins[name]} outside {requirement}"
        )


def test_torch_is_a_range_a_users_own_torch_can_fall_in():
    """`pip install handoff` beside another torch must not replace it: the range admits releases besides the lock's."""
    torch, vision = declared()["torch"].specifier, declared()["torchvision"].specifier
    assert all(torch.contains(v) for v in ("2.6.0", "2.10.0", locked()["torch"].public))
    assert all(vision.contains(v) for v in ("0.21.0", "0.25.0", locked()["torchvision"].public))


def test_the_bentos_pins_are_the_locks():
    pins = locked()
    packages = yaml.safe_load((ROOT / "bentofile.yaml").read_text())["python"]["packages"]
    for line in packages:
        requirement = Requirement(line)
        exact = [s for s in requirement.specifier if s.operator == "=="]
        assert exact, f"bentofile.yaml: {line} is not pinned; pin it to requirements/lock.txt's version"
        name = canonicalize_name(requirement.name)
        assert Version(exact[0].version) == pins[name], f"bentofile.yaml {line}, the lock {name}=={pins[name]}"


def imported_packages() -> set[str]:
    """The top-level modules handoff's library code imports that are neither its own nor the standard library's."""
    found = set()
    for folder in LIBRARY:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    found |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {*LIBRARY, "harness", "__future__"}


def test_every_imported_package_is_declared():
    distributions = importlib.metadata.packages_distributions()
    names = set(declared()) | set(optional())
    undeclared = []
    for module in sorted(imported_packages()):
        owners = {canonicalize_name(d) for d in distributions.get(module, [])}
        if not owners & names:
            undeclared.append(f"{module} (from {', '.join(sorted(owners)) or 'no installed distribution'})")
    assert not undeclared, f"imported but not in pyproject.toml's dependencies: {undeclared}"


def test_no_release_with_a_known_hole_is_admitted():
    """Security round 4, item 8: Pillow below 13 (JPEG decoder overflows fixed in 13; 10.0's wheels bundle the libwebp
    of CVE-2023-4863) and Starlette 0.40-0.49.0 (CVE-2025-62727, a Range header DoS in FileResponse) were allowed."""
    ranges = declared()
    for name, vulnerable in (("pillow", ("10.0.0", "12.2.0")), ("starlette", ("0.40.0", "0.49.0"))):
        assert not any(ranges[name].specifier.contains(v) for v in vulnerable), (name, str(ranges[name].specifier))
