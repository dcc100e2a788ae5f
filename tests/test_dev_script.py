"""``scripts/dev.py test`` ends with one line adding up every pytest run, so that CI's last line says how it went."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _dev() -> object:
    spec = importlib.util.spec_from_file_location("dev_script", REPO / "scripts" / "dev.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_pytest_summary_is_added_up() -> None:
    dev = _dev()
    lines = [
        "nox > Running session tests-3.11\n",
        "564 passed, 3 skipped, 41 deselected in 183.81s (0:03:03)\n",  # -q
        "========== 42 passed, 1 skipped in 62.38s (0:01:02) ==========\n",  # without -q
        "= 1 failed, 2 passed, 1 error in 3.00s =\n",
        "the test printed: 3 passed in 1s\n",  # not a summary line
    ]
    totals = dev.add_up(lines)  # type: ignore[attr-defined]
    assert totals == {"passed": 608, "failed": 1, "errors": 1, "skipped": 4, "runs": 3}
    assert dev.summary_line(totals, 0) == "tests: 608 passed, 1 failed, 1 errors, 4 skipped in 3 pytest runs"  # type: ignore[attr-defined]
    assert dev.summary_line(totals, 1).endswith("in 3 pytest runs (nox exited 1)")  # type: ignore[attr-defined]


def test_the_coverage_figure_is_repeated_in_the_last_line() -> None:
    dev = _dev()
    lines = [
        "Name                                 Stmts   Miss Branch BrPart  Cover\n",
        "spool_reporter/_hook.py                612     40    250     31  90.1%\n",
        "TOTAL                                 7012    812   2310    301  87.5%\n",
        "12 files skipped due to complete coverage.\n",
        "564 passed, 3 skipped in 183.81s (0:03:03)\n",
    ]
    figure = dev.coverage_total(lines)  # type: ignore[attr-defined]
    assert figure == "87.5%"
    line = dev.summary_line(dev.add_up(lines), 0, figure)  # type: ignore[attr-defined]
    assert line == "tests: 564 passed, 0 failed, 3 skipped in 1 pytest runs; coverage 87.5% of lines and branches"
    assert dev.coverage_total(lines[-2:]) is None  # type: ignore[attr-defined]  # no session measured


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's idle scheduling class")
def test_the_runs_beside_the_tests_take_only_idle_cpu_and_ports_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    dev = _dev()
    assert dev.can_run_beside({})  # type: ignore[attr-defined]
    assert not dev.can_run_beside({dev.BESIDE_ENV: "0"})  # type: ignore[attr-defined]
    probe = (
        "import os, pathlib; group = pathlib.Path('/proc/self/autogroup');"
        "print(os.sched_getscheduler(0) == os.SCHED_IDLE, os.sched_getscheduler(os.getppid()),"
        "group.read_text().split()[-1] if group.exists() else 'none')"
    )
    child = subprocess.run(
        [sys.executable, "-c", probe],
        start_new_session=True,
        preexec_fn=dev._at_idle_priority,  # type: ignore[attr-defined]
        capture_output=True,
        text=True,
        check=True,
    )
    idle, parent, group_nice = child.stdout.split()
    assert (idle, parent) == ("True", str(os.SCHED_OTHER))  # the child only, not this process
    assert group_nice in ("19", "none")  # its session's autogroup as low as a flusher's, where there are autogroups

    from support import ports

    assert dev.PORT_BLOCK_ENV == ports.PORT_BLOCK_ENV  # type: ignore[attr-defined]  # the name dev.py sets
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.delenv(ports.PORT_BLOCK_ENV, raising=False)
    assert ports.worker_index() == 2
    monkeypatch.setenv(ports.PORT_BLOCK_ENV, dev.BESIDE_PORT_BLOCK)  # type: ignore[attr-defined]
    assert ports.worker_index() == 17  # past the blocks of the tests sessions' workers
    first = ports.BASE + 17 * ports.BLOCK
    assert first <= ports.free_port() < first + ports.BLOCK


def test_the_variables_dev_sets_are_the_ones_the_noxfile_reads() -> None:
    """dev.py names the noxfile's variables again (it cannot import a file that imports nox): the same names."""
    import ast

    dev = _dev()
    tree = ast.parse((REPO / "noxfile.py").read_text())
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    assert constants["KEEP_SHARED_ENV"] == dev.KEEP_SHARED_ENV  # type: ignore[attr-defined]
    assert constants["BENCH_PART_ENV"] == dev.BENCH_PART_ENV  # type: ignore[attr-defined]
    assert f'os.environ.get("{dev.RUNS_ENV}", "")' in (REPO / "noxfile.py").read_text()  # type: ignore[attr-defined]


def test_the_benchmarks_parts_are_what_they_measure() -> None:
    """The noxfile's ``BENCH_PARTS``: a benchmark in the ``counted`` part counts instructions (what no load changes,
    run beside the tests); one with two parts runs each half with ``--part``; every one named exists."""
    import ast

    tree = ast.parse((REPO / "noxfile.py").read_text())
    (parts,) = [
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "BENCH_PARTS"
    ]
    assert parts
    for name, what in parts.items():
        text = (REPO / "benchmarks" / name).read_text()
        assert set(what) <= {"timed", "counted"}
        assert ("counted" in what) == ("instructions(" in text), name
        assert (len(what) == 2) == ('"--part"' in text), name


def _fake_nox(tmp_path: Path, log: Path) -> None:
    """A ``.dev-venv`` whose nox logs each call (its sessions, and the variables dev.py sets) and prints what the
    real sessions would: a pytest summary for each tests or django session, a coverage total for tests; it fails
    when it is asked for the session named in ``FAKE_NOX_FAILS``."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "uv").write_text("")
    nox = bindir / "nox"
    nox.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"with open({str(log)!r}, 'a') as f:\n"
        "    names = ('SPOOL_REPORTER_BENCH', 'SPOOL_REPORTER_TEST_RUNS')\n"
        "    f.write(json.dumps([sys.argv[2:], *map(os.environ.get, names)]) + '\\n')\n"
        "if 'tests' in sys.argv: print('3 passed in 0.10s'); print('TOTAL   10   1   2   0   90.0%')\n"
        "if 'django' in sys.argv: print('2 passed in 0.10s')\n"
        "sys.exit(int(os.environ.get('FAKE_NOX_FAILS') in sys.argv))\n"
    )
    nox.chmod(0o755)


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's idle scheduling class")
def test_check_timed_and_test_with_check_split_check_between_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``check --timed`` runs only the timed benchmarks; ``test --with-check`` runs the tests and, beside them, the
    check's sessions with only the counted benchmarks, and says in its last line how they went."""
    import json

    dev = _dev()
    log = tmp_path / "calls.jsonl"
    _fake_nox(tmp_path, log)
    monkeypatch.setattr(dev, "VENV", tmp_path)
    # Not the variables of the session this test runs in (a run of some tests: SPOOL_REPORTER_TEST_RUNS=serial).
    for name in ("FAKE_NOX_FAILS", dev.BESIDE_ENV, dev.BENCH_PART_ENV, dev.RUNS_ENV):  # type: ignore[attr-defined]
        monkeypatch.delenv(name, raising=False)

    assert dev.main(["check", "--timed", "-x"]) == 0  # type: ignore[attr-defined]
    assert [json.loads(line) for line in log.read_text().splitlines()] == [[["bench", "-x"], "timed", None]]

    log.unlink()
    assert dev.main(["test", "--with-check"]) == 0  # type: ignore[attr-defined]
    calls = sorted(json.loads(line) for line in log.read_text().splitlines())
    assert calls == [
        [["django"], None, "parallel"],
        [["django"], None, "serial"],
        [["lint", "typecheck", "docs", "bench"], "counted", None],
        [["tests"], None, None],
    ]
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == (
        "tests: 7 passed, 0 failed in 3 pytest runs; coverage 90.0% of lines and branches; check beside them passed"
    )

    monkeypatch.setenv("FAKE_NOX_FAILS", "lint")
    assert dev.main(["test", "--with-check"]) == 1  # type: ignore[attr-defined]
    assert capsys.readouterr().out.splitlines()[-1].endswith("; check beside them failed (nox exited 1)")
    assert dev.main(["test"]) == 0  # type: ignore[attr-defined]  # without the flag, no check
    assert "check beside" not in capsys.readouterr().out.splitlines()[-1]


def test_the_ci_script_runs_the_tests_last() -> None:
    script = (REPO / ".ci" / "run").read_text()
    order = [script.index(f"python3 scripts/dev.py {step}") for step in ("check", "demo", "test")]
    assert order == sorted(order)
    assert script.rstrip().splitlines()[-1].startswith("[ ")  # after the tests, nothing more is printed
    assert subprocess.run(["bash", "-n", str(REPO / ".ci" / "run")], check=False).returncode == 0


def test_quick_runs_the_test_files_a_change_touches() -> None:
    dev = _dev()
    tests = {
        "tests/client/test_spool.py": "from spool_reporter import _spool\n",
        "tests/client/test_record.py": "import spool_reporter._spool as spool\n",
        "tests/collector/test_collector_stores.py": "from spool_reporter.collector import _sqlite, _store\n",
        "tests/collector/test_public.py": "from spool_reporter.collector import _stats  # not _spool\n",
    }
    touched = dev.touched_tests  # type: ignore[attr-defined]
    assert touched(["spool_reporter/_spool.py"], tests) == ["tests/client/test_record.py", "tests/client/test_spool.py"]
    assert touched(["spool_reporter/collector/_store.py", "README.md"], tests) == [
        "tests/collector/test_collector_stores.py"
    ]
    assert touched(["tests/collector/test_public.py", "docs/testing.md"], tests) == ["tests/collector/test_public.py"]
    assert touched(["docs/testing.md"], tests) == []
