"""Malformed input at every entry point: exit status 2, a message naming what is wrong, no
traceback, nothing written."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main

JOB = {
    "name": "j",
    "work_gpu_hours": 2.0,
    "gpus": 1,
    "gpu_types": ["L4"],
    "start_offset_h": 0,
    "deadline_h": 24,
    "home_region": "us-east-1",
}


def jobs(tmp: Path, **over: object) -> Path:
    path = tmp / "jobs.yaml"
    path.write_text(yaml.safe_dump({"jobs": [{**JOB, **over}]}))
    return path


def raw(tmp: Path, text: bytes) -> Path:
    path = tmp / "jobs.yaml"
    path.write_bytes(text)
    return path


BOMB = b"""a: &a ["x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
jobs: [*i]
"""

# (name, files to make -> argv, what the message must say)
Case = tuple[str, Callable[[Path], list[str]], str]
CASES: list[Case] = [
    (
        "a deadline centuries away",
        lambda t: ["replay", "--jobs", str(jobs(t, deadline_h=1e308))],
        "deadline_h",
    ),
    (
        "an infinite throughput",
        lambda t: [
            "replay",
            "--jobs",
            str(
                raw(
                    t,
                    yaml.safe_dump({"jobs": [{**JOB, "throughput": {"L4": 1.0}}]})
                    .replace("1.0", ".inf")
                    .encode(),
                )
            ),
        ],
        "throughput",
    ),
    (
        "a zero throughput",
        lambda t: ["replay", "--jobs", str(jobs(t, throughput={"L4": 0}))],
        "throughput",
    ),
    (
        "bytes that are not UTF-8",
        lambda t: ["replay", "--jobs", str(raw(t, b"jobs: [\xff\xfe]"))],
        "UTF-8",
    ),
    ("a directory as the jobs file", lambda t: ["replay", "--jobs", str(t)], "directory"),
    ("a key twice", lambda t: ["replay", "--jobs", str(raw(t, b"jobs: []\njobs: []\n"))], "twice"),
    ("an anchor bomb", lambda t: ["replay", "--jobs", str(raw(t, BOMB))], "expand"),
    (
        "--out at a file",
        lambda t: [
            "replay",
            "--jobs",
            str(jobs(t)),
            "--days",
            "2",
            "--out",
            str(_file(t / "taken")),
        ],
        "taken",
    ),
    (
        "HELIOTROPE_HOME at a file",
        lambda t: [*_home(t, _file(t / "home")), "status"],
        "HELIOTROPE_HOME",
    ),
    (
        "an empty cluster name",
        lambda t: [*_home(t, _config(t, {"cluster": ""})), "status"],
        "cluster",
    ),
    (
        "a negative max age",
        lambda t: [*_home(t, _config(t, {"max_age": {"price_s": -5}})), "status"],
        "max_age.price_s",
    ),
    (
        "a job without a command",
        lambda t: [*_home(t, t / "h"), "jobs", "submit", str(jobs(t))],
        "[python, train.py]",
    ),
]


def _file(path: Path) -> Path:
    path.write_text("x")
    return path


def _config(tmp: Path, doc: dict[str, object]) -> Path:
    home = tmp / "h"
    home.mkdir(exist_ok=True)
    (home / "config.yaml").write_text(yaml.safe_dump(doc))
    return home


def _home(tmp: Path, home: Path) -> list[str]:
    os.environ["HELIOTROPE_HOME"] = str(home)
    return []


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_with_the_reason_and_writes_nothing(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _, make, says = case
    monkeypatch.setenv("HELIOTROPE_HOME", str(tmp_path / "unused-home"))
    monkeypatch.chdir(tmp_path)
    argv = make(tmp_path)
    before = _tree(tmp_path)
    t0 = time.monotonic()
    assert main(argv) == 2
    assert time.monotonic() - t0 < 30
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert says in err, err
    assert _tree(tmp_path) == before, "bad input wrote something"


def test_a_non_finite_number_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["replay", "--jobs", "x.yaml", "--tick-minutes", "nan"])
    assert exit_.value.code == 2
    assert "not a finite number: 'nan'" in capsys.readouterr().err


def test_status_on_a_store_not_made_yet_makes_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = _config(tmp_path, {"db_url": f"sqlite:///{tmp_path}/nowhere/h.db"})
    monkeypatch.setenv("HELIOTROPE_HOME", str(home))
    before = _tree(tmp_path)
    assert main(["status", "--json"]) == 0
    assert capsys.readouterr().out.strip() == "[]"
    assert main(["events", "lm"]) == 2  # no such job: said, not made
    assert _tree(tmp_path) == before
