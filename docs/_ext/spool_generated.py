"""Generated content for the docs: the shared mechanism, and the figures pages.

Some pages must show what the code and the test sessions really produce, not what someone typed: the CLI
reference (from the argparse parser), the requests each destination sends (from ``django-spool flush
--dry-run --json``), the benchmark and fault-suite figures (from ``docs/_generated/``). A page asks for such
content with a fenced block::

    ```{spool-generated} figures
    :include: *.json *.md
    :exclude: reliability*
    ```

At ``source-read`` time, before MyST parses the page, the block is replaced by Markdown that a registered
generator returns. Doing it on the source, rather than in a directive, lets generated content carry real
headings (they show up in the page's table of contents) and tables, with no docutils node plumbing.

The rules every generator follows:

* a feature that does not exist yet (no ``spool_reporter.cli``, no figures file) renders a visible note that
  says how to produce the content -- never a warning, so ``sphinx-build -W`` passes while the project grows;
* a feature that exists but fails (a crash, output that is not what the interface promises) is a warning,
  which ``-W`` turns into a failed build: the docs must not silently fall back to stale or invented content;
* the page notes a dependency on what it was generated from, so an incremental build re-reads it.

An unknown generator name is left in place, and MyST then reports the unknown directive (a build error).

One figure inside a sentence is the ``{figure}`` role: ``{figure}`flush.json:figures.wall_s``` prints the
value from ``docs/_generated/flush.json``, ``{figure}`bench_flush.py:WALL_BUDGET_S``` a benchmark's budget
constant. ``tests/test_docs.py`` fails on a measured figure or budget typed by hand on a page.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

DOCS = Path(__file__).resolve().parent.parent
REPO = DOCS.parent
GENERATED = DOCS / "_generated"

Generator = Callable[[Sphinx, str, dict[str, str]], str]
"""``(app, docname, options) -> Markdown``."""

GENERATORS: dict[str, Generator] = {}

_BLOCK = re.compile(
    r"^(?P<fence>`{3,})\{spool-generated\}[ \t]+(?P<name>[\w-]+)[ \t]*\n(?P<body>.*?)^(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
_OPTION = re.compile(r"^:(?P<key>[\w-]+):[ \t]*(?P<value>.*)$")


def register(name: str, generator: Generator) -> None:
    """Make ``{spool-generated} name`` blocks render through ``generator``."""
    GENERATORS[name] = generator


def note(text: str, kind: str = "note") -> str:
    """A MyST admonition (``note``, ``important``...) holding ``text``."""
    return f"\n:::{{{kind}}}\n{text.strip()}\n:::\n"


def fenced(text: str, lang: str = "text") -> str:
    """``text`` in a code fence longer than any backtick run inside it."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"\n{fence}{lang}\n{text.rstrip()}\n{fence}\n"


def number(value: float) -> str:
    """A number as the docs print it: thousands separators, a float's digits as the file has them."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"  # a budget of 2.0 s reads "2 s"
    return f"{value:,}"


def text(value: object) -> str:
    """A value as text for a table cell or a sentence: numbers with thousands separators, a list of plain
    values joined by commas, a mapping of plain values as ``key: value`` pairs. Never JSON: a reader should
    not have to parse brackets (a raw JSON list on a page is what ``tests/test_docs.py`` looks for)."""
    if value is None:
        return ""
    if isinstance(value, (int, float)):
        return number(value)
    if isinstance(value, list):
        return ", ".join(text(v) for v in value)
    if isinstance(value, dict):
        return "; ".join(f"{k}: {text(v)}" for k, v in value.items())
    return str(value)


def cell(value: object) -> str:
    """A Markdown table cell."""
    return text(value).replace("|", "\\|").replace("\n", " ")


def table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(cell(v) for v in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n" + "\n".join(lines) + "\n"


def is_records(value: object) -> bool:
    """A non-empty list of mappings: a table, one row per item."""
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def records_table(records: list[dict[str, Any]]) -> str:
    """Rows from a list of mappings; the columns are their keys, in order of first appearance."""
    header = list(dict.fromkeys(k for r in records for k in r))
    return table(header, [[r.get(k) for k in header] for r in records])


def _options(body: str) -> dict[str, str]:
    options = {}
    for line in body.splitlines():
        m = _OPTION.match(line.strip())
        if m:
            options[m["key"]] = m["value"].strip()
    return options


def _on_source_read(app: Sphinx, docname: str, source: list[str]) -> None:
    def replace(m: re.Match[str]) -> str:
        generator = GENERATORS.get(m["name"])
        if generator is None:
            return m[0]  # MyST reports the unknown directive
        return generator(app, docname, _options(m["body"]))

    source[0] = _BLOCK.sub(replace, source[0])


# --- figures from docs/_generated/ (benchmarks, fault suite) ---------------------------------------------

_UNITS = {"_us": "µs", "_ms": "ms", "_s": "s", "_mib": "MiB", "_kib": "KiB", "_bytes": "bytes", "_pct": "%"}


def _figure_name(key: str) -> str:
    for suffix, unit in _UNITS.items():
        if key.endswith(suffix):
            return f"`{key}` ({unit})"
    return f"`{key}`"


def _figures_tables(figures: dict[str, Any]) -> str:
    """A ``figure | value`` table of the plain figures (a list of plain values in one cell), then a table
    of its own for each figure that holds a mapping (``name | value``) or a list of records (columns
    from their keys), under the figure's name."""
    plain = [[_figure_name(k), v] for k, v in figures.items() if not isinstance(v, dict) and not is_records(v)]
    out = [table(["figure", "value"], plain)] if plain else []
    for key, value in figures.items():
        if isinstance(value, dict) and value:
            out.append(f"\n{_figure_name(key)}:\n" + table(["", "value"], [[k, v] for k, v in value.items()]))
        elif is_records(value):
            out.append(f"\n{_figure_name(key)}:\n" + records_table(value))
    return "".join(out)


def _render_json(data: Any, path: Path, level: str) -> str:
    rel = path.relative_to(REPO).as_posix()
    if not isinstance(data, dict):
        return f"\n{level} `{path.stem}`\n" + fenced(json.dumps(data, indent=2), "json")
    title = str(data.get("title") or data.get("name") or path.stem)
    out = [f"\n{level} {title}\n"]
    facts = []
    if data.get("command"):
        facts.append(f"Produced by `{data['command']}`")
    machine = data.get("machine")
    if isinstance(machine, dict):
        parts = [
            f"{machine.get('implementation', 'Python')} {machine.get('python', '')}".strip(),
            str(machine.get("system", "")),
            str(machine.get("machine", "")),
            f"{machine['cpus']} CPUs" if machine.get("cpus") else "",
        ]
        facts.append("on " + ", ".join(p for p in parts if p))
        if machine.get("when"):
            facts.append(f"at {machine['when']}")
    facts.append(f"(file `{rel}`).")
    out.append(" ".join(facts) + "\n")
    known = {"title", "name", "command", "machine", "figures", "budgets"}
    figures = data.get("figures")
    if isinstance(figures, dict) and figures:
        out.append(_figures_tables(figures))
    elif is_records(figures):
        out.append(records_table(figures))
    budgets = data.get("budgets")
    if isinstance(budgets, list) and budgets:
        rows = []
        for b in budgets:
            if isinstance(b, dict):
                met = b.get("ok")
                result = "met" if met is True else "**not met**" if met is False else ""
                if result and b.get("asserted") is False:
                    result += " (printed, not asserted)"
                rows.append([b.get("what", ""), b.get("measured", ""), b.get("budget", ""), result])
        out.append("\nBudgets:\n" + table(["what", "measured", "budget", "result"], rows))
    rest = {k: v for k, v in data.items() if k not in known}
    if rest:
        out.append("\nAlso in the file:\n" + _figures_tables(rest))
    return "".join(out)


def generate_figures(app: Sphinx, docname: str, options: dict[str, str]) -> str:
    """Render every ``docs/_generated`` file matching ``:include:`` and not ``:exclude:`` (globs).

    ``.json`` files are rendered as tables (the benchmarks' ``{name, command, machine, figures, budgets}``
    shape; anything else as pretty JSON); ``.md`` files are inserted as they are. ``:missing:`` is the
    text of the note shown when no file matches.
    """
    app.env.note_dependency(GENERATED)  # a folder: the page is re-read on every build, so it is never stale
    include = options.get("include", "*.json *.md").split()
    exclude = options.get("exclude", "").split()
    level = "#" * int(options.get("level", "2"))
    files = []
    if GENERATED.is_dir():
        for path in sorted(GENERATED.iterdir()):
            name = path.name
            if (
                path.is_file()
                and any(fnmatch.fnmatch(name, p) for p in include)
                and not any(fnmatch.fnmatch(name, p) for p in exclude)
            ):
                files.append(path)
    if not files:
        return note(options.get("missing", "No generated figures yet."))
    out = []
    for path in files:
        if path.suffix == ".md":
            out.append("\n" + path.read_text(encoding="utf-8") + "\n")
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            logger.warning("%s is not valid JSON: %s", path, exc, location=docname)
            continue
        out.append(_render_json(data, path, level))
    return "".join(out)


# --- one figure in a sentence: {figure}`collector.json:figures.ingest[sqlite gunicorn].best` ----------------

BENCHMARKS = REPO / "benchmarks"

_STEP = re.compile(r"\.?(?:\[(?P<select>[^\]]+)\]|(?P<key>[^.\[\]]+))")


class FigureError(Exception):
    pass


def _select(value: Any, step: str) -> Any:
    """``[2]`` is an item of a list; ``[sqlite gunicorn]`` the one record of a list holding that text."""
    if not isinstance(value, list):
        raise FigureError(f"[{step}] on a {type(value).__name__}")
    if step.isdigit():
        if int(step) >= len(value):
            raise FigureError(f"[{step}] past the end of a list of {len(value)}")
        return value[int(step)]
    found = [r for r in value if isinstance(r, dict) and step in r.values()]
    if len(found) != 1:
        raise FigureError(f"[{step}] matches {len(found)} records, not one")
    return found[0]


def lookup_json(data: Any, path: str) -> Any:
    """The value at ``path`` (``figures.ingest[sqlite gunicorn].best``) in a generated file's ``data``."""
    value = data
    end = 0
    for m in _STEP.finditer(path):
        if m.start() != end:
            break
        end = m.end()
        if m["select"] is not None:
            value = _select(value, m["select"])
        elif isinstance(value, dict) and m["key"] in value:
            value = value[m["key"]]
        else:
            raise FigureError(f"no {m['key']!r} here")
    if end != len(path):
        raise FigureError(f"cannot read {path[end:]!r}")
    return value


def benchmark_constant(path: Path, name: str) -> Any:
    """A module-level constant of a benchmark, read from its source (a benchmark is a script, not a package,
    and importing one would need its database drivers)."""
    import ast

    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return ast.literal_eval(value)
    raise FigureError(f"{path.name} has no constant {name}")


def resolve_figure(reference: str) -> tuple[Path, Any]:
    """``<file>.json:<path>`` in ``docs/_generated/``, or ``<benchmark>.py:<CONSTANT>`` in ``benchmarks/``."""
    source, sep, path = reference.partition(":")
    if not sep or not path:
        raise FigureError("expected <file>.json:<path> or <benchmark>.py:<CONSTANT>")
    if source.endswith(".json"):
        file = GENERATED / source
        if not file.is_file():
            raise FigureError(f"{file.relative_to(REPO)} does not exist")
        return file, lookup_json(json.loads(file.read_text(encoding="utf-8")), path)
    if source.endswith(".py"):
        file = BENCHMARKS / source
        if not file.is_file():
            raise FigureError(f"{file.relative_to(REPO)} does not exist")
        return file, benchmark_constant(file, path)
    raise FigureError(f"{source!r} is neither a generated .json file nor a benchmark .py")


def figure_role(  # noqa: PLR0917 - docutils calls a role with these seven positional arguments
    name: str, rawtext: str, text_: str, lineno: int, inliner: Any, options: Any = None, content: Any = None
) -> tuple[list[Any], list[Any]]:
    """``{figure}`collector.json:figures.ingest[sqlite gunicorn].best``` prints ``60,309``: a measured figure
    or a budget in a sentence, read at build time from where the benchmark wrote or defined it, so a page
    never shows a number that the last run contradicts. A reference that does not resolve is a warning
    (a failed build under ``-W``)."""
    from docutils import nodes

    env = inliner.document.settings.env
    try:
        file, value = resolve_figure(text_.strip())
        if isinstance(value, (dict, list)) or value is None:
            raise FigureError(f"{text_!r} is a {type(value).__name__}, not one figure")
    except (FigureError, OSError, ValueError, SyntaxError) as exc:
        logger.warning("figure: %s: %s", text_, exc, location=(env.docname, lineno))
        return [nodes.problematic(rawtext, rawtext)], []
    env.note_dependency(file)
    return [nodes.inline(rawtext, text(value), classes=["spool-figure"])], []


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("source-read", _on_source_read)
    app.add_role("figure", figure_role)
    register("figures", generate_figures)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
