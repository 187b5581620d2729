"""The layout holds: no package imports itself in a circle, and docs/design.md's tree ("Where the code lives")
names every module of contract/, export/ and serve/ in its folder, and no module that is not there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("contract", "train", "export", "serve", "harness")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(package: str) -> dict[str, set[str]]:
    """Each module of `package` and the modules of `package` it imports (at any level, TYPE_CHECKING included:
    a circle there is one in the design too)."""
    modules = {_module_name(p): p for p in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    target = f"{node.module}.{alias.name}"
                    found = target if target in modules else node.module if node.module in modules else None
                    if found is not None and found != name:
                        graph[name].add(found)
            elif isinstance(node, ast.Import):
                graph[name] |= {alias.name for alias in node.names if alias.name in modules and alias.name != name}
    return graph


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


@pytest.mark.parametrize("package", PACKAGES)
def test_no_package_imports_itself_in_a_circle(package):
    circle = _circle(_imports(package))
    assert circle is None, " -> ".join(circle or [])


def _tree_files() -> dict[str, set[str]]:
    """The modules docs/design.md's tree names, by top folder, as paths inside it ("http/router.py")."""
    text = (ROOT / "docs" / "design.md").read_text()
    block = re.search(r"## Where the code lives\n\n```\n(.*?)```", text, re.S)
    assert block, "docs/design.md has no tree under 'Where the code lives'"
    named: dict[str, set[str]] = {}
    folders: list[tuple[int, str]] = []  # (indentation, folder) open at this line
    for line in block.group(1).splitlines():
        indent = len(line) - len(line.lstrip())
        first = line.split()[0] if line.strip() else ""
        while folders and folders[-1][0] >= indent and (first.endswith("/") or indent < folders[-1][0] + 2):
            folders.pop()
        if first.endswith("/"):
            folders.append((indent, first))
            line = line.replace(first, "", 1)  # what follows may name the folder's modules
        if not folders:
            continue
        top, *inner = [folder for _, folder in folders]
        for name in re.findall(r"(?<![/\w])(\w+\.py)\b", line):
            named.setdefault(top.rstrip("/"), set()).add("".join(inner) + name)
    return named


@pytest.mark.parametrize("package", ["contract", "export", "serve"])
def test_the_design_tree_names_every_module_where_it_is(package):
    on_disk = {str(p.relative_to(ROOT / package)) for p in (ROOT / package).rglob("*.py") if p.name != "__init__.py"}
    named = _tree_files().get(package, set())
    assert not on_disk - named, f"in {package}/ but not in docs/design.md's tree: {sorted(on_disk - named)}"
    assert not named - on_disk, f"in docs/design.md's tree but not in {package}/: {sorted(named - on_disk)}"
