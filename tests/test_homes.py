"""One home for each fact (issue 34): a fact the package needs in several places is written in one module and
imported by the others, so that changing it changes every use. Read from the source, as a reviewer would."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "spool_reporter"
COLLECTOR = PACKAGE / "collector"


def _sources() -> dict[Path, str]:
    return {path: path.read_text(encoding="utf-8") for path in sorted(PACKAGE.rglob("*.py"))}


def _relative(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


def test_the_iso_week_calendar_is_one_module() -> None:
    """Only ``collector/_weeks.py`` turns a day into its ISO week or a week into its Monday."""
    found = [
        f"{_relative(path)}:{number}"
        for path, source in _sources().items()
        for number, line in enumerate(source.splitlines(), 1)
        if "isocalendar" in line and path != COLLECTOR / "_weeks.py"
    ]
    assert found == []


def test_one_url_redactor() -> None:
    """``_redact.redact_url`` is the one function that redacts a URL, and ``REDACTED`` is written once."""
    redactors, words = [], []
    for path, source in _sources().items():
        if path == PACKAGE / "_redact.py":
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef) and re.match(r"_?redact(_|$)", node.name):
                redactors.append(f"{_relative(path)}:{node.lineno} {node.name}")
            if isinstance(node, ast.Constant) and node.value == "REDACTED":
                words.append(f"{_relative(path)}:{node.lineno}")
    assert (redactors, words) == ([], [])


def _importers(module: str) -> set[str]:
    """The collector's modules that import ``module`` (a sibling's name, ``_store``), however they spell it."""
    found = set()
    for path in sorted(COLLECTOR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level == 1:
                names = [node.module] if node.module else [alias.name for alias in node.names]
            elif node.module and node.module.startswith("spool_reporter.collector."):
                names = [node.module.split(".")[2]]
            else:
                names = []
            if module in names and path.stem != module:
                found.add(path.stem)
    return found


def test_the_store_is_imported_for_storage_only() -> None:
    """The errors, values, refusal reasons and defaults live in ``_common``, so that a module needing one of them
    does not build on the store: at most 10 of the collector's modules import ``_store``."""
    importers = _importers("_store")
    assert len(importers) <= 10, sorted(importers)


def test_the_shared_modules_import_nothing_of_the_collector() -> None:
    """``_common`` and ``_weeks`` sit below every other module of the collector (the ``collector-layers``
    contract says so too; this names the rule where a newcomer reads the tests)."""
    for name in ("_common", "_weeks"):
        tree = ast.parse((COLLECTOR / f"{name}.py").read_text(encoding="utf-8"))
        relative = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level > 0]
        assert relative == [], name


def test_the_allow_header_is_written_once() -> None:
    """The collector answers a wrong method in one place, from its route table (``_wsgi.ROUTES``)."""
    found = [
        f"{_relative(path)}:{node.lineno}"
        for path, source in _sources().items()
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and node.value == "Allow"
    ]
    assert [where.rpartition(":")[0] for where in found] == ["spool_reporter/collector/_wsgi.py"]


def test_no_function_is_longer_than_80_lines() -> None:
    """A function a reader can hold at once: longer ones are split into the steps they take (gather, decide,
    print)."""
    long = [
        f"{_relative(path)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path, source in _sources().items()
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > 80
    ]
    assert long == []


def test_no_module_but_the_hook_is_longer_than_600_lines() -> None:
    """A module a reader can take in: past 600 lines one holds more than one concern, which get homes of their
    own. The hook is the one exception: everything ``record()`` runs is one module on purpose, for its import cost
    (``docs/design-notes.md``)."""
    long = [
        f"{_relative(path)} ({len(source.splitlines())} lines)"
        for path, source in _sources().items()
        if path != PACKAGE / "_hook.py" and len(source.splitlines()) > 600
    ]
    assert long == []


def test_the_stylesheet_is_a_file_of_the_installed_package() -> None:
    """The page's stylesheet is ``collector/page.css``, shipped in the wheel (the tests run against the installed
    package), not a Python string."""
    import importlib.resources

    from spool_reporter.collector import _html

    sheet = importlib.resources.files("spool_reporter.collector").joinpath("page.css")
    assert sheet.is_file()
    assert _html._CSS.startswith(sheet.read_text(encoding="utf-8"))
