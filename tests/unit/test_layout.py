"""The package's shape: module and class sizes, module docstrings, imports (no cycle, no reach
into another package's private modules)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "bridge"
MAX_MODULE_LINES = 450
MAX_CLASS_LINES = 300
MAX_SUMMARY_CHARS = 100


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def _package_of(module: str) -> str:
    """The package a module belongs to (a package's __init__ belongs to its parent)."""
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def _imports(module: str) -> set[str]:
    """The bridge modules ``module`` imports (anywhere in its body), as module names."""
    found: set[str] = set()
    for node in ast.walk(TREES[module]):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package up
                package = _package_of(module).split(".")
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(n for n in names if n in MODULES and n != module)
    return found


GRAPH = {name: _imports(name) for name in MODULES}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_is_small_and_says_its_role(module: str) -> None:
    lines = MODULES[module].read_text().count("\n")
    assert lines <= MAX_MODULE_LINES, f"{module}: {lines} lines (at most {MAX_MODULE_LINES})"
    doc = ast.get_docstring(TREES[module], clean=False)
    assert doc, f"{module} has no docstring"
    summary, _, rest = doc.partition("\n")
    assert summary.strip() and summary.rstrip().endswith("."), (
        f"{module}: the docstring's first line is not a sentence of its own: {summary!r}"
    )
    assert len(summary) <= MAX_SUMMARY_CHARS, f"{module}: summary line of {len(summary)} chars"
    assert not rest or rest.startswith("\n"), f"{module}: the summary line runs on"


def test_no_class_holds_two_roles() -> None:
    big = [
        f"{module}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for module, tree in TREES.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES
    ]
    assert not big, f"classes over {MAX_CLASS_LINES} lines: {big}"


def test_no_import_cycle() -> None:
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the path, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(GRAPH[module]):
            if state.get(dep) == 1:
                cycles.append([*path[path.index(dep) :], dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_packages_are_entered_through_their_public_face() -> None:
    # bridge.<pkg>.<module> is the package's own business: others import bridge.<pkg>.
    reaching = [
        f"{module} imports {dep}"
        for module, deps in GRAPH.items()
        for dep in deps
        if _package_of(dep) not in ("bridge", dep)  # a module inside a sub-package
        and _package_of(module) != _package_of(dep)  # imported from outside that package
    ]
    assert not reaching, reaching
    for package in {_package_of(m) for m in MODULES} - {"bridge"}:
        tree = TREES[package]
        exported = [
            node
            for node in tree.body
            if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
        ]
        assert exported, f"{package}/__init__.py names no __all__"


def test_a_package_module_does_not_import_its_own_package() -> None:
    # From inside, the __init__ would be half-built: siblings are imported directly.
    inward = [
        f"{module} imports {dep}"
        for module, deps in GRAPH.items()
        for dep in deps
        if dep != "bridge" and module.startswith(dep + ".")
    ]
    assert not inward, inward


# A script's reply is read in one place (bridge/store/calls.py); the runner looks only for the
# "undeclared" answer every script may give.
REPLY_READERS = {"bridge.store.calls", "bridge.store.scripts"}


def test_script_replies_are_read_in_one_place() -> None:
    indexed = [
        f"{module}:{node.lineno}"
        for module, tree in TREES.items()
        if module not in REPLY_READERS
        for node in ast.walk(tree)
        if isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and node.value.id == "reply"
    ]
    assert not indexed, indexed


def test_the_formatter_is_not_fought() -> None:
    """The repository is laid out by ruff: a '# fmt: skip' line is a rare exception (at most 10
    in bridge/, tests/, bench/ and scripts/), with its reason on the line before."""
    sources = [p for d in ("bridge", "tests", "bench", "scripts") for p in (ROOT / d).rglob("*.py")]
    skips = [
        (path, number)
        for path in sorted(sources)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if line.rstrip().endswith("# fmt: skip")
    ]
    assert len(skips) <= 10, f"{len(skips)} '# fmt: skip' lines: {skips[:20]}"
    for path, number in skips:
        before = path.read_text().splitlines()[number - 2].strip()
        assert before.startswith("#"), f"{path}:{number}: '# fmt: skip' without a reason above"


def test_bench_and_the_test_bed_import_no_test_module() -> None:
    """The benchmarks and the test bed they share with the tests (testbed/) import nothing from
    tests/: a test may change without a benchmark knowing."""
    found = []
    for directory in ("bench", "testbed"):
        for path in sorted((ROOT / directory).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                found += [
                    f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "tests"
                ]
    assert not found, found


def test_the_rules_on_function_size_are_on() -> None:
    """ruff's rules on a function's returns, branches, statements and arguments hold everywhere;
    the files excepted name their reason above the exception (pyproject.toml: a comment, then
    the files it is the reason for)."""
    import tomllib

    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert not {"PLR0911", "PLR0912", "PLR0913", "PLR0915", "PLR0917"} & set(lint["ignore"])
    assert {"PL"} <= set(lint["select"]) and lint["pylint"]["max-args"] <= 8
    text = (ROOT / "pyproject.toml").read_text().splitlines()
    for number, line in enumerate(text):
        if line.startswith('"bridge/') and "PLR09" in line:
            above = number - 1
            while text[above].startswith('"bridge/'):
                above -= 1
            assert text[above].startswith("#"), f"{line}: no reason above"


def test_the_console_calls_the_tools_not_the_command_line() -> None:
    """The console's API calls bridge.ops with typed options, as the command line does: no
    module of the bridge but its entry point imports the command line, and none points
    sys.stdout or sys.stderr elsewhere to read what a command printed."""

    def cli(module: str) -> bool:
        return module == "bridge.cli" or module.startswith("bridge.cli.")

    callers = [m for m, deps in GRAPH.items() if not cli(m) and any(cli(d) for d in deps)]
    assert sorted(callers) == ["bridge.__main__"], callers
    swapped = [
        f"{module}:{node.lineno}"
        for module, tree in TREES.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and (target.value.id, target.attr) in {("sys", "stdout"), ("sys", "stderr")}
    ]
    assert not swapped, swapped


def test_every_script_is_one_typed_call_with_its_keys_named_once() -> None:
    """Each Lua script has its Script in bridge/store/scripts.py — its KEYS by name in the
    script's order, its reply read into a named type (bridge/store/calls.py) — with as many keys as the script's header
    documents; the runner's untyped entry (Scripts._run) is called from nowhere else."""
    import re

    from bridge.store.scripts import SCRIPTS

    lua = PACKAGE / "store" / "lua"
    scripts = {p.stem for p in lua.glob("*.lua") if not p.stem.startswith("_")}
    assert scripts == set(SCRIPTS)
    for name, script in SCRIPTS.items():
        documented = re.findall(r"KEYS\[(\d+)\](?!\.\.)", (lua / f"{name}.lua").read_text())
        assert len(script.names) == max(map(int, documented)), name
    raw = [
        f"{module}:{node.lineno}"
        for module, tree in TREES.items()
        if module != "bridge.store.scripts"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr in ("_run", "_evalsha")
        and "scripts" in ast.unparse(node.value)
    ]
    assert not raw, raw
