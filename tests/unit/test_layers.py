"""The house's layout holds: each part of xbench imports only the parts below it
(docs/architecture.md draws them), so there is no circle and no upward import."""

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGE = ROOT / "xbench"
# Each part and what it may import; anything not named is above it. The worker is the child
# process and imports nothing of the parent.
MAY_IMPORT = {
    "errors": set(),
    "stats": set(),
    "plugins": {"errors"},
    "models": {"plugins", "errors", "stats"},
    "contract": {"models", "stats", "errors"},
    "wire": {"contract", "models", "stats", "errors"},
    "experiment": {"contract", "models", "stats", "errors"},
    "worker": {"wire", "contract", "stats", "errors"},
    "results": {"experiment", "wire", "contract", "models", "stats", "errors"},
    "run": {"results", "experiment", "wire", "contract", "models", "plugins", "stats", "errors"},
    "report": {"results", "experiment", "contract", "models", "stats", "errors"},
    "cli": {"report", "run", "results", "experiment", "wire", "contract", "models", "stats", "errors"},
}


def part_of(path: Path) -> str:
    first = path.relative_to(PACKAGE).parts[0]
    return first.removesuffix(".py")


def parts_imported(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "xbench":  # from xbench import stats
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("xbench."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("xbench.")}
    return found


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if part_of(p) in MAY_IMPORT)


def test_every_part_of_the_package_has_a_place():
    placed = {part_of(p) for p in PACKAGE.rglob("*.py")} - {"__init__", "__main__"}
    assert placed == set(MAY_IMPORT)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_module_imports_only_the_parts_below_its_own(path):
    part = part_of(path)
    above = parts_imported(path) - MAY_IMPORT[part] - {part}
    assert above == set(), f"{path.relative_to(ROOT)} ({part}/) imports {sorted(above)}"


# The frameworks are plugins: the core names none of them in its code (docstrings and comments
# may give examples). A framework's name as a value would make its rows behave differently.
FRAMEWORK_NAMES = frozenset({"jax", "flax", "optax", "torch", "tf", "tensorflow", "keras"})


def string_values(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module that are not docstrings."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_core_names_no_framework_in_its_code(path):
    named = [(line, value) for line, value in string_values(path) if value.strip().lower() in FRAMEWORK_NAMES]
    assert not named, f"{path.relative_to(ROOT)} names a framework: {named}"


MAX_MODULE_LINES = 500  # a module past this holds two things; split it where they part


def test_no_module_of_the_package_outgrows_one_reading():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"
