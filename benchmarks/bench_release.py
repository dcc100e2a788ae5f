"""The error of the public numbers: what differential privacy costs a released week, at 100, 1,000 and 100,000
developers a week, at the default budget.

For each size, one week of raw events is generated on the mix of ``benchmarks/bench_stats.py`` (Django 5.2,
6.0 and 4.2 with some older versions; CPython 3.10 to 3.13 and a little PyPy; Linux, macOS, Windows and a
little FreeBSD and "other"; 4 % of the developers on two Django versions that week), loaded into a real
SQLite store, and counted once by ``_release.week_counts``, what a week's release counts. Then ``--draws``
releases of that week are drawn through ``_release.Noisy``, the mechanism the releases use, at the default
budget: ε 1 a week, 0.5 for each of its two releases (the provisional and the final release are each one
such draw; the page shows the final one). Each released number is post-processed by ``_public.number`` as it
is published: the estimate ``max(n, 0)``, the 95 % interval ``[low, high]``, and ``fewer_than: N`` (shown as
"fewer than N") when the estimate is below N: for the week's total N is the larger of the display threshold and
the release's margin; for a breakdown cell, the larger of the display threshold and the family-wise threshold
(``_public.cell_threshold``: a value nobody used shows a number in at most one release in twenty).

Figures, per size, over every draw:

- **the week's total**: the median and 95th percentile of |estimate - true|, beside the same for the noise
  alone, from the discrete Laplace distribution of the mechanism's scale b (P(|X| <= k) = 1 - 2t^(k+1)/(1+t),
  t = e^(-1/b));
- **the breakdown cells** (``by_django``, ``by_python``, ``by_os``, every value of the fixed vocabulary):
  over the cells with a true count above 0, the median and 95th percentile of |estimate - true|, the share
  shown as "fewer than N" and the share of the breakdowns' developers behind those; over the cells with a
  true count of 0 (released too, so that the set of values says nothing), the share shown with a number
  anyway, and how many such cells a release shows on average;
- **the interval**: the share of every released number whose interval holds the true count.

These are figures, not budgets. The one assertion is a sanity check of the measurement: the median absolute
error of the total is within 2x of the theoretical one at every size.

    python benchmarks/bench_release.py [--draws 1000]
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SIZES = (100, 1_000, 100_000)
"""Developers a week."""
SANITY_FACTOR = 2.0
"""The measured median absolute error of the total must be within this factor of the theoretical one."""
APP = "Django"


def noise_quantile(scale: float, q: float) -> int:
    """The smallest k with P(|X| <= k) >= q, X discrete Laplace of ``scale`` (P(X = k) proportional to
    e^(-|k|/scale))."""
    t = math.exp(-1 / scale)
    # P(|X| <= k) = 1 - 2 t^(k+1) / (1 + t)
    return max(0, math.ceil(math.log((1 - q) * (1 + t) / 2) / math.log(t)) - 1)


def measure(
    true_total: int, cells: dict[str, dict[str, int]], draws: int, min_count: int
) -> dict[str, float | int | str]:
    """Draw ``draws`` week releases of (``true_total``, ``cells``) and sum up their errors."""
    from _common import percentile

    from spool_reporter.collector import _common, _public, _release

    noisy = _release.Noisy(sensitivity=_release.WEEK_SENSITIVITY, epsilon=_common.EPSILON * _release.PROVISIONAL_SHARE)
    order = [(name, value) for name, counts in cells.items() for value in counts]
    threshold = _public.cell_threshold(noisy.scale, len(order))
    true = [true_total, *(cells[name][value] for name, value in order)]
    in_cells = sum(true[1:])  # the breakdowns' developers (each developer once per breakdown)
    total_err: list[float] = []
    cell_err: list[float] = []
    hidden = hidden_developers = shown_empty = covered = 0
    occupied = sum(1 for n in true[1:] if n > 0)
    empty = len(true) - 1 - occupied
    for _ in range(draws):
        released = noisy(true)
        for i, (n, truth) in enumerate(zip(released, true, strict=True)):
            shown = _public.number(n, noisy.margin, min_count, threshold=None if i == 0 else threshold)
            covered += shown["low"] <= truth <= shown["high"]
            err = abs(shown["estimate"] - truth)
            if i == 0:
                total_err.append(err)
            elif truth > 0:
                cell_err.append(err)
                if "fewer_than" in shown:
                    hidden += 1
                    hidden_developers += truth
            elif "fewer_than" not in shown:
                shown_empty += 1
    theory_p50, theory_p95 = noise_quantile(noisy.scale, 0.5), noise_quantile(noisy.scale, 0.95)
    return {
        "developers_per_week": true_total,
        "epsilon": noisy.epsilon,
        "scale": round(noisy.scale, 3),
        "margin": noisy.margin,
        "shown_from": max(min_count, noisy.margin),
        "cells_shown_from": max(min_count, threshold),
        "draws": draws,
        "total_abs_err_p50": statistics.median(total_err),
        "total_abs_err_p95": percentile(total_err, 95),
        "noise_abs_p50_theory": theory_p50,
        "noise_abs_p95_theory": theory_p95,
        "total_rel_err_p50_pct": round(statistics.median(total_err) / true_total * 100, 3),
        "cells_occupied": occupied,
        "cells_empty": empty,
        "cell_abs_err_p50": statistics.median(cell_err),
        "cell_abs_err_p95": percentile(cell_err, 95),
        "cells_fewer_than_pct": round(hidden / (occupied * draws) * 100, 1),
        "developers_in_fewer_than_pct": round(hidden_developers / (in_cells * draws) * 100, 1),
        "empty_cells_shown_pct": round(shown_empty / (empty * draws) * 100, 2) if empty else 0.0,
        "empty_cells_shown_per_release": round(shown_empty / draws, 2),
        "interval_coverage_pct": round(covered / (len(true) * draws) * 100, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=1000, help="releases drawn per size (default: %(default)s)")
    args = parser.parse_args()
    try:
        import spool_reporter.collector  # noqa: F401 - installed (nox -s bench)?
    except ImportError:
        sys.path.insert(0, str(REPO))  # from a checkout
    sys.path.insert(0, str(REPO / "benchmarks"))
    from _common import publish
    from bench_stats import LAST_MONDAY, load, week_name, week_rows

    from spool_reporter.collector import _common, _release, open_store

    started = time.perf_counter()
    rng = random.Random(8)
    rows: list[dict[str, float | int | str]] = []
    with tempfile.TemporaryDirectory(prefix="spool-bench-release-") as tmp:
        store = open_store(os.path.join(tmp, "release.sqlite3"))
        try:
            for k, size in enumerate(SIZES):
                monday = LAST_MONDAY - datetime.timedelta(weeks=k)
                load(store, week_rows(rng, monday, size))
                with store.reading() as reader:
                    total, cells = _release.week_counts(reader, APP, week_name(monday))
                assert total == size, (total, size)
                rows.append(measure(total, cells, args.draws, _common.MIN_COUNT))
        finally:
            store.close()
    wall = round(time.perf_counter() - started, 1)

    first = rows[0]
    print(
        f"\nThe error of a released week at the default budget: ε {first['epsilon']:g} per release (two a week), "
        f"discrete Laplace of scale {first['scale']:g}, margin ±{first['margin']} (95 %); a total shown as "
        f'"fewer than {first["shown_from"]}" below it, a cell below {first["cells_shown_from"]}; '
        f"{args.draws} releases per size"
    )
    print("\nThe week's total: |estimate - true|, measured and the noise's own (theory)")
    print(f"{'devs/week':>10}{'p50':>7}{'p95':>7}{'p50 th.':>9}{'p95 th.':>9}{'p50 rel.':>10}")
    for r in rows:
        print(f"{r['developers_per_week']:>10,}{r['total_abs_err_p50']:>7g}{r['total_abs_err_p95']:>7g}"
              f"{r['noise_abs_p50_theory']:>9}{r['noise_abs_p95_theory']:>9}"
              f"{r['total_rel_err_p50_pct']:>9}%")  # fmt: skip
    shape = ", ".join(f"{name} {len(values)}" for name, values in _release.vocabulary(APP).items())
    print(f"\nThe breakdown cells ({int(first['cells_occupied']) + int(first['cells_empty'])} a week: {shape}): "
          "|estimate - true| over the cells with developers;")  # fmt: skip
    print('those shown as "fewer than N" and their developers; the empty cells shown with a number; the share of '
          "intervals holding the true count")  # fmt: skip
    head = (("devs/week", 10), ("cells>0", 8), ("p50", 6), ("p95", 6), ("<N cells", 10), ("<N devs", 9),
            ("empty", 7), ("empty shown", 13), ("per release", 12), ("coverage", 10))  # fmt: skip
    print("".join(f"{name:>{width}}" for name, width in head))
    for r in rows:
        print(f"{r['developers_per_week']:>10,}{r['cells_occupied']:>8}{r['cell_abs_err_p50']:>6g}"
              f"{r['cell_abs_err_p95']:>6g}{r['cells_fewer_than_pct']:>9}%{r['developers_in_fewer_than_pct']:>8}%"
              f"{r['cells_empty']:>7}{r['empty_cells_shown_pct']:>12}%{r['empty_cells_shown_per_release']:>12}"
              f"{r['interval_coverage_pct']:>9}%")  # fmt: skip
    print(f"wall time: {wall} s")

    budgets: list[dict[str, object]] = []
    for r in rows:
        theory = float(r["noise_abs_p50_theory"])
        measured = float(r["total_abs_err_p50"])
        budgets.append({
            "what": f"median |error| of the week total at {r['developers_per_week']:,} developers, against the "
                    f"noise's own median (a check of the measurement)",
            "measured": f"{measured:g} (theory {theory:g})",
            "budget": f"within {SANITY_FACTOR:g}x of the theory",
            "ok": theory / SANITY_FACTOR <= measured <= theory * SANITY_FACTOR,
        })  # fmt: skip
    command = ("python benchmarks/bench_release.py " + " ".join(sys.argv[1:])).strip()
    ok = publish("release", command, rows, budgets)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
