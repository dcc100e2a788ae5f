"""Shared helpers for the benchmarks: percentiles, a fixed-format table, and publishing figures for the docs.

Each ``bench_*.py`` prints its figures, writes them to ``docs/_generated/<name>.json`` (the docs'
Performance page renders those files; commit them after a local ``nox -s bench``), and exits non-zero when
a budget is exceeded.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

GENERATED = Path(__file__).resolve().parent.parent / "docs" / "_generated"


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in [0, 100]."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def machine() -> dict[str, object]:
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "system": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def publish(name: str, command: str, figures: dict[str, object], budgets: list[dict[str, object]]) -> bool:
    """Write ``docs/_generated/<name>.json``; print budgets; return whether all were met."""
    ok = all(bool(b["ok"]) for b in budgets)
    GENERATED.mkdir(parents=True, exist_ok=True)
    data = {"name": name, "command": command, "machine": machine(), "figures": figures, "budgets": budgets}
    (GENERATED / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    for b in budgets:
        print(f"  budget {'OK  ' if b['ok'] else 'FAIL'} {b['what']}: {b['measured']} (budget {b['budget']})")
    sys.stdout.flush()
    return ok
