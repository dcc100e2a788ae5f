"""The suite's layout (``tests/README.md``): what the test modules share lives in ``tests/support/`` (or a folder's
``conftest.py`` for fixtures), so no module imports from another test module or from a ``conftest.py``. Importing a
test module runs its module-level code and brings its tests and fixtures along, and a newcomer reading the import
cannot tell a shared helper from a test."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """Every module an ``import`` statement anywhere in ``tree`` names (inside functions too), with its line:
    ``from a.b import c`` names ``a.b`` and ``a.b.c`` (``c`` may be a module)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}".replace("..", ".")) for alias in node.names]
    return found


def imports_of_tests(source: str) -> list[tuple[int, str]]:
    """The imports in ``source`` of a test module (``test_*``) or of a ``conftest``."""
    return sorted(
        {
            (line, name)
            for line, name in imported_modules(ast.parse(source))
            if (last := name.rsplit(".", 1)[-1]).startswith("test_") or last == "conftest"
        }
    )


def test_the_check_sees_every_form_of_import() -> None:
    source = textwrap.dedent(
        """
        from collector.test_collector import batch
        from client import test_cli
        import faults.test_clock
        from .test_spool import x
        from conftest import sandbox
        def later():
            from client.test_spawn import flusher_idle
        from support.events import batch
        from collector._helpers import y
        import support.test_data_not_a_test  # a module named test_* is one, wherever it is
        """
    )
    assert [line for line, _ in imports_of_tests(source)] == [2, 3, 4, 5, 6, 8, 11]


def test_no_module_imports_from_a_test_module() -> None:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for line, name in imports_of_tests(path.read_text(encoding="utf-8")):
            found.append(f"{path.relative_to(TESTS)}:{line}: {name}")
    assert found == [], "move what is shared into tests/support/ (tests/README.md):\n" + "\n".join(found)


def test_version_branches_are_in_code_tested_on_every_python() -> None:
    """``tests/conftest.py`` runs only the client's and the Django integration's tests on every Python
    (docs/testing.md, "What runs where"): a branch on ``sys.version_info`` in the collector would be tested on one."""
    package = TESTS.parent / "spool_reporter"
    branched = sorted(
        str(path.relative_to(package)) for path in package.rglob("*.py") if "sys.version_info" in path.read_text()
    )
    assert branched, "the package has version branches (_hook.py, _spawn.py): this check reads the right files"
    assert [name for name in branched if name.startswith("collector")] == []


def _module_table() -> list[tuple[list[str], list[str]]]:
    """The rows of ``tests/README.md``'s "Which tests test a module": (modules, test files), each as a path
    relative to ``spool_reporter/`` or ``tests/``; a module after the first of its row takes the first's folder."""
    text = (TESTS / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Which tests test a module") :]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[0].startswith("`"):
            continue
        names = [part.split("`")[1] for part in cells[0].split(",")]
        folder = names[0].rpartition("/")[0]
        modules = [names[0], *(f"{folder}/{name}" if folder and "/" not in name else name for name in names[1:])]
        tests = [part.split("`")[1] for part in cells[1].split(",") if part.strip().startswith("`")]
        rows.append((modules, [name for name in tests if name.endswith(".py")]))
    return rows


def test_every_module_has_its_tests_named() -> None:
    """Each module of the package has a row in ``tests/README.md``'s table (a folder's row counts for its
    modules), and each test file the table names exists."""
    package = TESTS.parent / "spool_reporter"
    rows = _module_table()
    named = {module for modules, _ in rows for module in modules}
    modules = sorted(path.relative_to(package).as_posix() for path in package.rglob("*.py"))
    missing = [m for m in modules if m not in named and not any(m.startswith(f) for f in named if f.endswith("/"))]
    assert missing == []
    assert [m for m in sorted(named) if not (package / m).exists()] == []
    assert [t for _, tests in rows for t in tests if not (TESTS / t).is_file()] == []
    assert all(tests for _, tests in rows)
