"""The attacks the public releases must defeat, as tests.

**Fabricated developers.** Anyone can post events under made-up client ids. Under the old k-anonymity threshold,
9 fakes on Django 4.1 in a week of 40 real developers let an attacker read whether 0, 1 or 2 real developers used
4.1; 108 fakes made a week too small to publish cross the threshold and give away its one real developer's
(Django, Python, OS); forgetting the fakes then hid the trace. Now every cell of a fixed vocabulary is released
with discrete Laplace noise scaled for one developer's whole contribution, so whatever the fakes, what is
released about a week changes in probability by at most e^ε with one real developer's presence or values.

These tests check that statistically, as the attacker would meet it: the two worlds are counted by the release's
own counting (:func:`~spool_reporter.collector._release.week_counts` on a real store), the noise is drawn by the
release's own mechanism (:class:`~spool_reporter.collector._release.Noisy`, built as
:func:`~spool_reporter.collector._release.release` builds it for a week's provisional and final releases), and the
attacker's decision rules -- every threshold on the released 4.1 counts, and every threshold on the likelihood
ratio of the two worlds (the most powerful rules, by Neyman and Pearson) -- must satisfy
P[guess 1 | world 1] <= e^ε P[guess 1 | world 0], in both directions and for both guesses.

Only the cells whose true counts differ between the two worlds are drawn: the others have the same count in
both worlds and independent noise, so any rule that reads them is a randomised rule on the differing cells and
achieves nothing more (their likelihood ratio is exactly 1).

**The statistical slack.** A correct mechanism fails a check here with probability at most 1e-6
(:data:`FAILURE`), split in two halves:

- every threshold rule on either statistic, by the Dvoretzky-Kiefer-Wolfowitz inequality (Massart's constant),
  which bounds all thresholds of an empirical distribution function at once,
  P(sup_t |F_n(t) - F(t)| > d) <= 2 exp(-2 n d^2): for the 2 statistics x 2 worlds at 0.5e-6,
  d = sqrt(ln(2 * 4 / 0.5e-6) / (2n)) = 0.0204 for n = 20,000, and the test asserts
  p1_hat <= e^ε (p0_hat + d) + d (an additive slack: it tests the likely rules);
- every threshold rule on the likelihood ratio (which takes at most (cells + 1)^releases values, known in advance:
  25 or 49 rules), by Chernoff's binomial bound P(k/n <= a) <= exp(-n KL(a || p)) inverted into a lower and an
  upper bound for each rule, world and side at 0.5e-6 together, and the test asserts
  lower(P1[A]) <= e^ε upper(P0[A]) (a relative slack: it tests the rare rules, where the ratio e^ε bites).

Each test also shows the check has power: the same attacker, checked against the same ε, catches the old exact
counts, noise at the largest ε the collector accepts, noise scaled for one cell instead of a developer's whole
contribution, and (for the nine fakes) a third of the right noise.

**Snapshots.** Saving ``/v1/stats`` every few minutes, from several worker processes with caches of their own,
used to show each newcomer's exact values. Now four real collector processes on one database serve the same
bytes, change only when a release is made, and never show a newcomer between two releases.
"""

from __future__ import annotations

import bisect
import datetime
import json
import math
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import urllib3

from spool_reporter._hook import iso_time
from spool_reporter.collector import Policy, Publishing, Retention, make_app, open_store
from spool_reporter.collector._common import MAX_EPSILON, Row
from spool_reporter.collector._public import CHECK_SECONDS, document, releases_json
from spool_reporter.collector._release import (
    FINAL,
    PROVISIONAL,
    WEEK_SENSITIVITY,
    Noisy,
    Plan,
    due,
    periods,
    release,
    week_counts,
)
from spool_reporter.collector._store import Store
from spool_reporter.collector._weeks import this_week

from support.collector_server import Served, read_line, start_server
from support.events import at, batch, det_uuid4, event, event_row, monday, week_after
from support.polling import wait_for
from support.releases import flat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from support.sandbox import Sandbox

pytestmark = pytest.mark.timeout(180)

HTTP = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=5, read=20))

WEEK = "2027-W05"
TRIALS = 20_000
"""Fresh releases per world: the slack shrinks as 1/sqrt(TRIALS) (0.020 here); OpenDP draws about 140,000 noise
values a second, so a test's draws take two to three seconds."""
POWER_TRIALS = 2_000
"""Trials of the power checks whose mechanisms break the bound grossly (the slack is 0.06 at this size)."""
FAILURE = 1e-6
"""The probability that a correct mechanism fails a statistical check here."""

Cell = tuple[str, str]


# -- the attacker and the check ------------------------------------------------------------------------------------


def dkw_slack(n: int, distributions: int, failure: float) -> float:
    """d such that ``distributions`` empirical distribution functions of ``n`` samples each are all within d of
    the truth, everywhere, with probability at least 1 - ``failure`` (DKW with Massart's constant, union bound)."""
    return math.sqrt(math.log(2 * distributions / failure) / (2 * n))


def _kl(p: float, q: float) -> float:
    """The Kullback-Leibler divergence of Bernoulli(p) from Bernoulli(q)."""
    out = 0.0
    if p > 0:
        out += p * math.log(p / q) if q > 0 else math.inf
    if p < 1:
        out += (1 - p) * math.log((1 - p) / (1 - q)) if q < 1 else math.inf
    return out


def binomial_bounds(k: int, n: int, log_inverse: float) -> tuple[float, float]:
    """(lower, upper) bounds on p from k successes in n trials, each failing with probability at most
    exp(-``log_inverse``): Chernoff's bound P[k/n <= a] <= exp(-n KL(a || p)) for a < p (and its mirror),
    inverted by bisection."""
    p_hat = k / n

    def outer(toward: float) -> float:
        inside, outside = p_hat, toward
        for _ in range(100):
            mid = (inside + outside) / 2
            if n * _kl(p_hat, mid) <= log_inverse:
                inside = mid
            else:
                outside = mid
        return outside  # the side that is certainly beyond the bound: conservative

    return outer(0.0), outer(1.0)


class Exact:
    """The old behaviour: the true counts, released as they are (for the power checks)."""

    scale = 0.5  # what the attacker's likelihood ratio divides by: any positive number orders it the same
    epsilon = math.inf

    def __call__(self, values: Sequence[int]) -> list[int]:
        return list(values)


Mechanism = Callable[[Sequence[int]], list[int]]


def week_mechanisms(epsilon: float = 1.0) -> list[Noisy]:
    """The noise of a week's two releases (provisional, then final), built as ``release()`` builds it from the plans
    ``due()`` makes: each at its share of ``epsilon``, scaled for a developer's whole contribution."""
    start = monday(WEEK)
    ended = at(start + datetime.timedelta(days=8))
    (provisional,) = due(now=ended, first_week=WEEK, closed_through="", retain_days=400, epsilon=epsilon, made=set())
    (final,) = due(
        now=ended, first_week=WEEK, closed_through=WEEK, retain_days=400, epsilon=epsilon, made={(WEEK, PROVISIONAL)}
    )
    assert (provisional.kind, final.kind) == (PROVISIONAL, FINAL)
    return [Noisy(sensitivity=WEEK_SENSITIVITY, epsilon=plan.epsilon) for plan in (provisional, final)]


class Observed:
    """The attacker's two statistics over ``trials`` fresh sets of releases in each world.

    :ivar count: the released counts of the target cell, summed over the releases (world 0, world 1).
    :ivar ratio: the log-likelihood ratio of world 1 to world 0 given everything released in the cells that differ,
        computed with the scale each release states (world 0, world 1).
    :ivar lattice: how many values the ratio can take at all (each differing cell moves it by plus or minus
        1/scale, the worlds' counts differing by one): the number of threshold rules on it, known in advance.
    """

    def __init__(
        self,
        mechanisms: Sequence[Mechanism],
        world0: dict[Cell, int],
        world1: dict[Cell, int],
        target: Cell,
        trials: int,
    ) -> None:
        cells = [cell for cell in world0 if world0[cell] != world1[cell]]
        assert target in cells
        assert all(abs(world1[cell] - world0[cell]) == 1 for cell in cells)
        self.count: tuple[list[float], list[float]] = ([], [])
        self.ratio: tuple[list[float], list[float]] = ([], [])
        self.lattice = (len(cells) + 1) ** len(mechanisms)
        self.trials = trials
        for w, world in enumerate((world0, world1)):
            true = [world[cell] for cell in cells]
            draws = [mech(true * trials) for mech in mechanisms]  # one call per release: independent noise per cell
            for i in range(trials):
                count = llr = 0.0
                for mech, drawn in zip(mechanisms, draws, strict=True):
                    released = drawn[i * len(cells) : (i + 1) * len(cells)]
                    scale = float(mech.scale)  # type: ignore[attr-defined]
                    for cell, x in zip(cells, released, strict=True):
                        llr += (abs(x - world0[cell]) - abs(x - world1[cell])) / scale
                        if cell == target:
                            count += x
                self.count[w].append(count)
                self.ratio[w].append(round(llr, 9))
        assert len({*self.ratio[0], *self.ratio[1]}) <= self.lattice

    def dkw_excess(self, epsilon: float) -> tuple[float, str]:
        """The largest amount by which a threshold rule on either statistic breaks
        ``P[A | one world] <= e^epsilon (P[A | other] + d) + d`` (for A = {T >= t} and {T < t}, either world first;
        d the DKW slack at FAILURE / 2 for the four distribution functions), and that rule; <= 0 when none does."""
        slack = dkw_slack(self.trials, 4, FAILURE / 2)
        factor = math.exp(epsilon)
        worst, rule = -math.inf, ""
        for name, (s0, s1) in (("count", self.count), ("ratio", self.ratio)):
            for t, p0, p1 in _tails(s0, s1):
                for what, x, y in _four(t, p0, p1):
                    gap = x - (factor * (y + slack) + slack)
                    if gap > worst:
                        worst, rule = gap, f"{name} {what}: {x:.4f} vs {y:.4f} (slack {slack:.4f})"
        return worst, rule

    def binomial_excess(self, epsilon: float) -> tuple[float, str]:
        """The largest amount by which a threshold rule on the likelihood ratio breaks
        ``lower(P[A | one world]) <= e^epsilon upper(P[A | other])``, in logarithms, with the binomial bounds of every
        rule of the lattice, both worlds and both sides at FAILURE / 2 together; <= 0 when none does."""
        log_inverse = math.log(2 * 2 * self.lattice / (FAILURE / 2))
        n = self.trials
        worst, rule = -math.inf, ""
        for t, p0, p1 in _tails(*self.ratio):
            low0, high0 = binomial_bounds(round(p0 * n), n, log_inverse)
            low1, high1 = binomial_bounds(round(p1 * n), n, log_inverse)
            for what, low, high in (
                (f"T >= {t:g} in world 1 vs 0", low1, high0),
                (f"T >= {t:g} in world 0 vs 1", low0, high1),
                (f"T < {t:g} in world 0 vs 1", 1 - high0, 1 - low1),
                (f"T < {t:g} in world 1 vs 0", 1 - high1, 1 - low0),
            ):
                if low <= 0:
                    continue
                gap = math.log(low) - math.log(high) - epsilon if high > 0 else math.inf
                if gap > worst:
                    worst, rule = gap, f"ratio {what}: at least {low:.4f} vs at most {high:.4f}"
        return worst, rule

    def assert_bounded(self, epsilon: float) -> None:
        """Every threshold rule keeps within e^epsilon, up to the statistical slack (fails with p <= FAILURE)."""
        for excess in (self.dkw_excess(epsilon), self.binomial_excess(epsilon)):
            assert excess[0] <= 0, f"{excess[1]} breaks e^{epsilon:g} (by {excess[0]:.4f})"

    def assert_caught(self, epsilon: float) -> None:
        """Some threshold rule breaks e^epsilon beyond the slack: :meth:`assert_bounded` would fail."""
        assert max(self.dkw_excess(epsilon)[0], self.binomial_excess(epsilon)[0]) > 0


def _tails(s0: list[float], s1: list[float]) -> Iterator[tuple[float, float, float]]:
    """(t, P0[T >= t], P1[T >= t]) empirically, for every value t seen and beyond."""
    a, b = sorted(s0), sorted(s1)
    for t in sorted({*a, *b, math.inf}):
        yield t, (len(a) - bisect.bisect_left(a, t)) / len(a), (len(b) - bisect.bisect_left(b, t)) / len(b)


def _four(t: float, p0: float, p1: float) -> tuple[tuple[str, float, float], ...]:
    """The four comparisons ε-DP bounds for the rule "guess by T >= t": each guess, each world first."""
    return (
        (f"T >= {t:g} in world 1 vs 0", p1, p0),
        (f"T >= {t:g} in world 0 vs 1", p0, p1),
        (f"T < {t:g} in world 0 vs 1", 1 - p0, 1 - p1),
        (f"T < {t:g} in world 1 vs 0", 1 - p1, 1 - p0),
    )


# -- counting the worlds on a real store ---------------------------------------------------------------------------


@pytest.fixture
def sqlite(tmp_path: Path) -> Iterator[Callable[[str], Store]]:
    """Opens SQLite stores in the test's folder, and closes them afterwards."""
    opened: list[Store] = []

    def make(name: str) -> Store:
        store = open_store(tmp_path / f"{name}.sqlite3")
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


def counted(store: Store, week: str = WEEK) -> dict[Cell, int]:
    with store.reading() as reader:
        return flat(week_counts(reader, "Django", week))


def diff(world0: dict[Cell, int], world1: dict[Cell, int]) -> dict[Cell, int]:
    return {cell: world1[cell] - world0[cell] for cell in world0 if world1[cell] != world0[cell]}


TARGET: Cell = ("by_django", "4.1")
RARE = {"version": "4.1", "python": "PyPy 3.10", "os_name": "FreeBSD"}
"""The real developer's values the attacker is after."""


def forty_real(day: datetime.date, target: dict[str, str]) -> list[Row]:
    """40 real developers of whom none uses Django 4.1, except developer 0 if ``target`` says so."""
    rows = [event_row(("real", 0), day, **target)]
    for i in range(1, 40):
        rows.append(
            event_row(
                ("real", i),
                day + datetime.timedelta(days=i % 7),
                version=["5.2", "4.2", "5.1", "6.0", "5.0"][i % 5],
                python=["CPython 3.12", "CPython 3.11", "CPython 3.13"][i % 3],
                os_name=["Linux", "macOS", "Windows"][i % 3],
            )
        )
    return rows


def nine_fakes(day: datetime.date) -> list[Row]:
    return [event_row(("fake", i), day, version="4.1") for i in range(9)]


def test_nine_fabricated_developers_learn_at_most_epsilon(sqlite: Callable[[str], Store]) -> None:
    """9 fakes on 4.1 in a week of 40 real developers: does one real developer use 4.1? In world 0 they use
    (5.2, CPython 3.12, Linux), in world 1 (4.1, PyPy 3.10, FreeBSD): every breakdown changes, the largest change
    one developer can make (6 in L1, the noise's sensitivity), so the bound e^ε is tight here."""
    day = monday(WEEK) + datetime.timedelta(days=1)
    plain = {"version": "5.2", "python": "CPython 3.12", "os_name": "Linux"}
    world0_store, world1_store = sqlite("world0"), sqlite("world1")
    world0_store.insert([*forty_real(day, plain), *nine_fakes(day)])
    world1_store.insert([*forty_real(day, RARE), *nine_fakes(day)])
    world0, world1 = counted(world0_store), counted(world1_store)
    assert world0[TARGET] == 9  # the old attacker read "9 + real users of 4.1" from the exact count
    assert diff(world0, world1) == {
        ("by_django", "4.1"): 1,
        ("by_django", "5.2"): -1,
        ("by_python", "PyPy 3.10"): 1,
        ("by_python", "CPython 3.12"): -1,
        ("by_os", "FreeBSD"): 1,
        ("by_os", "Linux"): -1,
    }
    assert sum(abs(v) for v in diff(world0, world1).values()) == WEEK_SENSITIVITY
    mechanisms = week_mechanisms()
    epsilon = sum(m.epsilon for m in mechanisms)
    assert epsilon <= 1.0
    Observed(mechanisms, world0, world1, TARGET, TRIALS).assert_bounded(epsilon)
    # Power: the same attacker and check catch the old exact counts, noise at ten times the budget per release
    # (the most the collector accepts), noise scaled for one cell instead of a developer's whole contribution (a
    # sixth of the noise), and even a third of the noise (sensitivity 2: e^3 instead of e^1).
    Observed([Exact(), Exact()], world0, world1, TARGET, 200).assert_caught(epsilon)
    loud = [Noisy(sensitivity=WEEK_SENSITIVITY, epsilon=MAX_EPSILON)] * 2
    Observed(loud, world0, world1, TARGET, POWER_TRIALS).assert_caught(epsilon)
    one_cell = [Noisy(sensitivity=1, epsilon=m.epsilon) for m in mechanisms]
    Observed(one_cell, world0, world1, TARGET, POWER_TRIALS).assert_caught(epsilon)
    a_third = [Noisy(sensitivity=2, epsilon=m.epsilon) for m in mechanisms]
    Observed(a_third, world0, world1, TARGET, TRIALS).assert_caught(epsilon)


def test_the_release_draws_the_noise_the_attack_was_checked_against(sqlite: Callable[[str], Store]) -> None:
    """``release()`` states (and uses, see test_public.py) the scale and ε of :func:`week_mechanisms`."""
    store = sqlite("world")
    store.insert(nine_fakes(monday(WEEK)))
    (week,) = (p for p in periods(monday(WEEK), monday(WEEK) + datetime.timedelta(days=6)) if p.unit == "week")
    now = at(monday(WEEK) + datetime.timedelta(days=8))
    for kind, mechanism in zip((PROVISIONAL, FINAL), week_mechanisms(), strict=True):
        body = json.loads(release(store, Plan(week, kind, mechanism.epsilon), app="Django", now=now).body)
        assert (body["scale"], body["epsilon"], body["sensitivity"]) == (
            mechanism.scale,
            mechanism.epsilon,
            mechanism.sensitivity,
        )


# -- 108 fakes in a small week -------------------------------------------------------------------------------------


def fakes_108(day: datetime.date) -> list[Row]:
    """108 fabricated developers in one batch, spread so that every cell near the real developer's is well filled
    (what once pushed a small week over the threshold)."""
    combos = [
        (version, python, os_name)
        for version in ("4.1", "4.2", "5.2")
        for python in ("PyPy 3.10", "CPython 3.12")
        for os_name in ("FreeBSD", "Linux")
    ]
    return [
        event_row(("fake108", i), day, version=v, python=p, os_name=o)
        for i, (v, p, o) in enumerate(combo for combo in combos for _ in range(9))
    ]


def test_108_fakes_learn_at_most_epsilon_about_the_one_real_developer(sqlite: Callable[[str], Store]) -> None:
    """A small week: one real developer on (4.1, PyPy 3.10, FreeBSD) and 108 fakes in one batch. Every cell is
    released whatever the week's size, so the fakes unlock nothing; with or without the real developer (world 0 is
    the same store after forgetting them), the releases differ by noise only: 4 cells, within e^ε."""
    day = monday(WEEK) + datetime.timedelta(days=2)
    store = sqlite("small-week")
    store.insert([event_row("the-real-one", day, **RARE), *fakes_108(day)])
    world1 = counted(store)
    assert store.forget(det_uuid4("client", "the-real-one"), until=time.time()) == 1  # world 0: without them
    world0 = counted(store)
    assert (world1[("developers", "")], world0[("developers", "")]) == (109, 108)
    assert diff(world0, world1) == {
        ("developers", ""): 1,
        ("by_django", "4.1"): 1,
        ("by_python", "PyPy 3.10"): 1,
        ("by_os", "FreeBSD"): 1,
    }
    mechanisms = week_mechanisms()
    epsilon = sum(m.epsilon for m in mechanisms)
    Observed(mechanisms, world0, world1, TARGET, TRIALS).assert_bounded(epsilon)
    Observed([Exact(), Exact()], world0, world1, TARGET, 200).assert_caught(epsilon)
    one_cell = [Noisy(sensitivity=1, epsilon=m.epsilon) for m in mechanisms]
    Observed(one_cell, world0, world1, TARGET, POWER_TRIALS).assert_caught(epsilon)


def _wsgi(app: object, method: str, path: str, body: bytes = b"") -> tuple[str, bytes]:
    """One request through the WSGI application itself."""
    import io

    environ = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body),
    }
    seen: list[str] = []
    out = b"".join(app(environ, lambda status, headers: seen.append(status)))  # type: ignore[operator]
    return seen[0], out


def test_forgetting_the_fakes_changes_no_stored_release(db_url: str) -> None:
    """The release made while the fakes were in is stored once; forgetting them all afterwards (through
    ``POST /v1/forget``) changes neither it nor anything served."""
    clock = [at(monday(WEEK) + datetime.timedelta(days=3))]
    store = open_store(db_url)
    store.set_first_week(WEEK)
    store.close()
    app = make_app(
        db_url,
        policy=Policy(clock=lambda: clock[0]),
        retention=Retention(rollup_every=0),
        publishing=Publishing(),
    )
    try:
        when = iso_time(clock[0] - 3600)
        real = event(client="the-real-one", when=when, app_version="4.1", python="PyPy", python_version="3.10",
                     os_name="FreeBSD", valid=False)  # fmt: skip
        assert _wsgi(app, "POST", "/v1/batch", batch([real]))[0] == "200 OK"
        fakes = [
            event(client=("fake108", i), when=when, app_version=["4.1", "5.2"][i % 2], os_name="FreeBSD", valid=False)
            for i in range(108)
        ]
        status, answer = _wsgi(app, "POST", "/v1/batch", batch(fakes))  # one batch
        assert (status, json.loads(answer)["accepted"]) == ("200 OK", 108)
        clock[0] = at(monday(WEEK) + datetime.timedelta(days=7), 2.0)
        done = app.rollup()
        assert [(r.period, r.kind) for r in done.released] == [(WEEK, PROVISIONAL)]
        stored = app.store.releases("Django")
        served = {path: _wsgi(app, "GET", path) for path in ("/v1/stats", "/v1/releases.json", "/v1/releases.csv")}
        assert served["/v1/releases.json"] == ("200 OK", releases_json(stored, app.publishing))
        with app.store.reading() as reader:
            true = flat(week_counts(reader, "Django", WEEK))
        assert (true[("developers", "")], true[("by_os", "FreeBSD")]) == (109, 109)
        body = json.loads(stored[0].body)
        released = {("developers", ""): body["developers"]}
        released.update({(name, v): n for name in ("by_django", "by_python", "by_os") for v, n in body[name].items()})
        assert released.keys() == true.keys()  # every cell of the vocabulary, as for any week
        assert released != true  # noise, not the true counts (all 75 cells unchanged: p < 1e-90)
        for i in range(108):
            forget = json.dumps({"client_id": det_uuid4("client", ("fake108", i))}).encode()
            status, answer = _wsgi(app, "POST", "/v1/forget", forget)
            assert (status, json.loads(answer)) == ("200 OK", {"deleted": 1})
        assert app.rollup().released == ()
        assert app.store.releases("Django") == stored  # byte for byte: (app, period, kind, made, epsilon, body)
        app.public.check_every = 0.0  # ask the database again now: the answers are still the same bytes
        assert {path: _wsgi(app, "GET", path) for path in served} == served
    finally:
        app.store.close()


# -- snapshots from several processes ------------------------------------------------------------------------------

EAGER = r"""
import signal, sys
from spool_reporter.collector import Retention, open_store
from spool_reporter.collector._server import CollectorServer
from spool_reporter.collector._wsgi import Collector

# The shipped application, re-reading the releases' mark on every request (public_check=0), never rolling up itself.
app = Collector(open_store(sys.argv[1]), retention=Retention(rollup_every=0), public_check=0.0)
server = CollectorServer(app)
signal.signal(signal.SIGTERM, lambda *_: server.request_stop())
print(f"listening on {server.url}", flush=True)
server.serve_forever()
server.stop()
"""
"""A collector process that asks the database on every request whether a release was added: if anything but a
release could change what it serves, a poll would show it at once."""


def start_eager(db: str, env: dict[str, str], tmp: Path, name: str) -> Served:
    stderr = tmp / f"{name}.stderr"
    with stderr.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", EAGER, db], stdout=subprocess.PIPE, stderr=err, env=env, text=True, bufsize=1
        )
    line = read_line(proc, 30)
    assert line.startswith("listening on http://127.0.0.1:"), (line, stderr.read_text(errors="replace"))
    return Served(proc, line.split()[-1], stderr)


def test_snapshots_from_four_processes_see_only_the_releases(
    db_url: str,
    sandbox: Sandbox,
    tmp_path: Path,
) -> None:
    """Four collector processes on one database, polled while the (simulated) release clock moves through two
    weeks and developers arrive, come late and are forgotten between the polls: at each poll the processes that
    re-read on every request serve byte-identical documents, equal to the stored releases' document; the
    shipped ``serve`` (which re-reads every CHECK_SECONDS; on SQLite) serves one of the same documents and
    catches up; the documents ever seen are exactly one per release made, plus the empty one."""
    real_now = time.time()
    week_a = this_week(real_now - 14 * 86400)  # weeks whose events the processes' real clocks still accept
    week_b, week_c = week_after(week_a), week_after(week_a, 2)
    assert week_c == this_week(real_now)
    store = open_store(db_url)
    store.set_first_week(week_a)
    store.close()
    clock = [real_now]
    roller = make_app(db_url, policy=Policy(clock=lambda: clock[0]), retention=Retention(rollup_every=0))
    processes: list[Served] = []
    try:
        # On SQLite the fourth process is the shipped command as an operator starts it, which re-reads only every
        # CHECK_SECONDS (so the test waits for it once, at the end); on PostgreSQL four that re-read every time.
        shipped = not db_url.startswith("postgresql")
        for i in range(3 if shipped else 4):
            processes.append(start_eager(db_url, sandbox.env, tmp_path, f"eager-{i}"))
        if shipped:
            processes.append(start_server(Path(db_url), sandbox.env, tmp_path, "--rollup-every", "0"))
        eager = processes[:3] if shipped else processes
        bases = [p.url.removesuffix("/v1/batch") for p in processes]
        documents: list[bytes] = []  # one per release made, in order, the empty document first
        seen: set[bytes] = set()
        polls = 0

        def expected() -> bytes:
            doc = document(roller.store.releases("Django"), roller.publishing, first_week=roller.store.first_week())
            return json.dumps(doc, ensure_ascii=True).encode("ascii")

        def poll() -> None:
            nonlocal polls
            polls += 1
            answers = [HTTP.request("GET", base + "/v1/stats") for base in bases]
            assert all(a.status == 200 for a in answers)
            bodies = [a.data for a in answers]
            seen.update(bodies)
            assert bodies[: len(eager)] == [documents[-1]] * len(eager), f"poll {polls}"
            assert bodies[-1] in documents, f"poll {polls}: the shipped serve shows a document never released"

        def post(process: int, events: list[dict[str, object]]) -> None:
            response = HTTP.request(
                "POST", processes[process].url, body=batch(events), headers={"Content-Type": "application/json"}
            )
            assert response.status == 200
            assert json.loads(response.data)["rejected"] == 0

        def arrive(week: str, first: int, count: int, *, day: int = 1) -> None:
            when = min(at(monday(week) + datetime.timedelta(days=day), 9.0), real_now)
            for i in range(first, first + count):
                version = ["5.2", "4.2", "4.1", "6.0"][i % 4]
                post(
                    i % len(processes),
                    [event(client=("dev", i), when=iso_time(when), app_version=version, valid=False)],
                )

        def roll(at_time: float) -> int:
            clock[0] = at_time
            done = roller.rollup()
            assert done.release_error == ""
            if done.released:
                documents.append(expected())
            return len(done.released)

        documents.append(expected())
        poll()
        arrive(week_a, 0, 20)
        poll()  # twenty newcomers, no release: nothing changes
        assert roll(at(monday(week_b), 1.0)) == 1  # week A has ended: its provisional release
        poll()
        arrive(week_a, 20, 3, day=4)  # late developers of week A
        arrive(week_b, 100, 4)
        poll()
        status = HTTP.request(
            "POST",
            bases[1] + "/v1/forget",
            body=json.dumps({"client_id": det_uuid4("client", ("dev", 0))}).encode(),
            headers={"Content-Type": "application/json"},
        ).status
        assert status == 200
        poll()
        assert roll(at(monday(week_b) + datetime.timedelta(days=3))) == 0  # nothing due mid-week
        poll()
        assert roll(at(monday(week_c), 1.0)) == 1  # a week later: week B's provisional release
        poll()
        arrive(week_c, 200, 1, day=0)  # one newcomer between two polls, no release between them
        poll()
        if shipped:
            wait_for(
                lambda: HTTP.request("GET", bases[-1] + "/v1/stats").data == documents[-1],
                timeout=CHECK_SECONDS + 10,
                interval=0.25,
                what="the shipped serve to show the newest release",
            )
        poll()
        releases = roller.store.releases("Django")
        assert [(r.period, r.kind) for r in releases] == [(week_a, PROVISIONAL), (week_b, PROVISIONAL)]
        assert seen == set(documents)  # nothing was ever served but the documents of the releases ...
        assert len(seen) == len(releases) + 1  # ... one per release, and the empty one before the first
    finally:
        for process in processes:
            if process.proc.poll() is None:
                process.proc.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                process.proc.kill()
                process.proc.communicate(timeout=10)
        roller.store.close()
    for process in processes:
        assert process.proc.returncode == 0, process.stderr.read_text(errors="replace")
