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


def cell(value: object) -> str:
    """A Markdown table cell."""
    text = value if isinstance(value, str) else json.dumps(value)
    return text.replace("|", "\\|").replace("\n", " ")


def table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n" + "\n".join(lines) + "\n"


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
        out.append(table(["figure", "value"], [[_figure_name(k), v] for k, v in figures.items()]))
    elif isinstance(figures, list) and figures and all(isinstance(r, dict) for r in figures):
        header = list(dict.fromkeys(k for r in figures for k in r))
        out.append(table(header, [[r.get(k, "") for k in header] for r in figures]))
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
        out.append(fenced(json.dumps(rest, indent=2), "json"))
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


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("source-read", _on_source_read)
    register("figures", generate_figures)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
