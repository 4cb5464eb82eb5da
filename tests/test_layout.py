"""The import rules of docs/design.md (Layout): the framework never imports the study (repro/), the strict config
loader imports nothing of ours, the model imports nothing from the training side nor the fast path, the fast path
only the model, the packages that own a config section never import the root config.py, and no two of our modules
import each other in a cycle (imports under `if TYPE_CHECKING:` name types only and are left out). Read from the
source with `ast`, so a rule holds for every file, imported by a test or not."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("strictconfig", "model", "fast", "data", "optim", "runtime", "bench", "scripts", "harness", "repro")
ROOT_MODULES = ("train", "config", "runs")


def our_modules() -> dict[str, Path]:
    """Every module of ours by dotted name: the packages' files and the root's commands, no tests."""
    found = {name: REPO / f"{name}.py" for name in ROOT_MODULES}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            if "tests" in parts:
                continue
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The modules of ours that `path` imports anywhere (function bodies included), outside TYPE_CHECKING blocks."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def add(target: str) -> None:
        while target and target not in modules:  # `from a.b import c`: c may be a name in a.b, or a module
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for alias in node.names:
                add(f"{base}.{alias.name}" if base else alias.name)
        for child in ast.iter_child_nodes(node):
            visit(child)
    visit(ast.parse(path.read_text(), filename=str(path)))
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = our_modules()
    return {name: imports_of(path, name, modules) for name, path in modules.items()}


def _top(name: str) -> str:
    return name.split(".")[0]


def test_the_framework_never_imports_the_study(graph):
    bad = {m: sorted(i for i in deps if _top(i) == "repro") for m, deps in graph.items() if _top(m) != "repro"}
    assert not {m: d for m, d in bad.items() if d}


def test_the_strict_config_loader_is_the_ground_floor(graph):
    bad = {m: sorted(i for i in deps if _top(i) != "strictconfig") for m, deps in graph.items() if _top(m) == "strictconfig"}
    assert not {m: d for m, d in bad.items() if d}


def test_the_model_imports_nothing_of_the_training_side(graph):
    allowed = {"model", "strictconfig"}
    bad = {m: sorted(i for i in deps if _top(i) not in allowed) for m, deps in graph.items() if _top(m) == "model"}
    assert not {m: d for m, d in bad.items() if d}


def test_the_fast_path_sits_on_the_model_alone(graph):
    """fast/ reads the reference model (and the strict config loader), nothing of the training side: it is applied at build
    time by runtime/build.py, and the model never knows it exists (the rule above)."""
    allowed = {"fast", "model", "strictconfig"}
    bad = {m: sorted(i for i in deps if _top(i) not in allowed) for m, deps in graph.items() if _top(m) == "fast"}
    assert not {m: d for m, d in bad.items() if d}
    assert "fast" in graph["runtime.build"]


def test_the_sections_never_import_the_composed_config(graph):
    """The packages that own a config section (and what they build on) never import the root config.py, and it imports
    nothing of the training side: so runtime/, bench/ and the commands import it directly, without a cycle."""
    libraries = {"strictconfig", "model", "fast", "data", "optim"}
    assert not sorted(m for m, deps in graph.items() if _top(m) in libraries and "config" in deps)
    assert not sorted(d for d in graph["config"] if _top(d) in ("runtime", "bench", "scripts", "harness", "repro"))


def test_no_import_cycle(graph):
    """Depth-first search for a back edge; the cycle found is named in the failure."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        path.pop()
        state[m] = 2
        return None
    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            assert cycle is None, " → ".join(cycle)


def test_the_rules_see_what_they_check(graph):
    """The reader finds real imports, relative and function-local ones included, so the rules above can fail."""
    assert "model.scaling" in graph["model.llama"] and "strictconfig.config" in graph["config"]
    assert "repro.runner" in graph["repro.results"] and "runtime.trainer" in graph["train"]
