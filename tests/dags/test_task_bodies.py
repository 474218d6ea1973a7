"""The task bodies in orchestrator/airflow_tasks.py, without Airflow: settings, credentials,
migrate (the CLI's refusals, word for word), rebalance (a tick, or a skip with its reason)
and replay (a report, a window)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator import airflow_tasks as at
from orchestrator.cli import main
from orchestrator.errors import InputError
from tests.dags.conftest import write_jobs
from tests.dags.fake_sources import uk_carbon_server


def numbers_out(text: str) -> str:
    return re.sub(r"\d+(\.\d+)?", "N", " ".join(text.split()))


def settings(home: Path, **extra: Any) -> at.TaskSettings:
    return at.task_settings({"home": str(home), **extra})


# -- settings ------------------------------------------------------------------------------


def test_settings_from_the_environment_and_the_variable(home: Path, tmp_path: Path) -> None:
    s = at.task_settings(None)
    assert s.home == home and s.trace_dir == home / "signals"
    assert s.regions == () and s.signal_max_age_s == 3600.0
    s = at.task_settings(
        json.dumps(
            {
                "home": str(tmp_path / "h"),
                "regions": "us-east-1, europe-west4",
                "signal_max_age_s": 600,
            }
        )
    )
    assert s.home == tmp_path / "h" and s.trace_dir == tmp_path / "h" / "signals"
    assert s.regions == ("us-east-1", "europe-west4") and s.signal_max_age_s == 600.0


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ('{"hom": "/x"}', "hom"),
        ("[1, 2]", "a JSON object"),
        ("{not json", "a JSON object"),
        ('{"signal_max_age_s": 0}', "signal_max_age_s"),
        ('{"regions": [1]}', "regions"),
        ('{"sources": ["uk_carbon"]}', "sources"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(home: Path, value: str, words: str) -> None:
    with pytest.raises(InputError, match=words):
        at.task_settings(value)


# -- credentials ---------------------------------------------------------------------------


class FakeConnection:
    def __init__(self, login: str = "", password: str = "", **extra: str) -> None:
        self.login, self.password, self.extra_dejson = login, password, dict(extra)


def test_credentials_come_from_the_connections_and_never_show() -> None:
    from orchestrator.signals.sources import carbon, clouds, power

    conns = {
        "aws_default": FakeConnection(
            "AKIAEXAMPLE",
            "aws-secret-value",
            region_name="us-east-1",
            endpoint_url="http://127.0.0.1:5000",
        ),
        "google_cloud_default": FakeConnection(extra_field="x", api_key="gcp-key-value"),
        "electricitymaps_default": FakeConnection(password="em-token-value"),
        "watttime_default": FakeConnection("wt-user", "wt-password-value"),
        "eia_default": FakeConnection(password="eia-key-value"),
    }
    asked: list[str] = []

    def get(conn_id: str) -> FakeConnection | None:
        asked.append(conn_id)
        return conns.get(conn_id)

    creds = at.credentials_from(get)
    assert sorted(asked) == sorted(at.CONNECTION_IDS.values())
    # The names are the ones the sources read.
    assert creds[carbon.EM_TOKEN_ENV] == "em-token-value"
    assert creds[carbon.WT_USER_ENV] == "wt-user"
    assert creds[carbon.WT_PASSWORD_ENV] == "wt-password-value"
    assert creds[clouds.GCP_KEY_ENV] == "gcp-key-value"
    assert creds[power.EIA_KEY_ENV] == "eia-key-value"
    assert power.ENTSOE_TOKEN_ENV not in creds  # no entsoe_default: the environment decides
    assert creds[clouds.AWS_ENDPOINT_ENV] == "http://127.0.0.1:5000"
    assert creds["AWS_ACCESS_KEY_ID"] == "AKIAEXAMPLE"
    assert creds["AWS_SECRET_ACCESS_KEY"] == "aws-secret-value"
    assert creds["AWS_DEFAULT_REGION"] == "us-east-1"
    shown = repr(creds) + str(creds) + f"{creds}"
    for secret in ("em-token-value", "wt-password-value", "aws-secret-value", "gcp-key-value"):
        assert secret not in shown
    assert "ELECTRICITYMAPS_TOKEN" in shown
    options = at._aws_options(creds)
    assert options is not None and "aws_clients" in options
    assert at._aws_options({}) is None  # boto3's own chain


# -- signals -------------------------------------------------------------------------------


def test_the_families_are_the_poll_sources() -> None:
    from orchestrator.signals.poll import SOURCE_NAMES

    names = [n for family in at.SIGNAL_FAMILIES.values() for n in family]
    assert sorted(names) == sorted(SOURCE_NAMES) and len(names) == len(set(names))


def test_regions_per_family(home: Path) -> None:
    s = at.task_settings(None)
    assert at.signal_regions(s) == [
        "aws:us-east-1",
        "aws:eu-north-1",
        "gcp:us-central1",
        "gcp:europe-west4",
    ]
    assert at.signal_regions(s, "aws") == ["aws:us-east-1", "aws:eu-north-1"]
    assert at.signal_regions(s, "gcp") == ["gcp:us-central1", "gcp:europe-west4"]
    assert at.signal_regions(s, "carbon") == at.signal_regions(s)
    s = at.task_settings({"regions": ["eu-west-2", "gcp:europe-west2", "eu-west-2"]})
    assert at.signal_regions(s) == ["aws:eu-west-2", "gcp:europe-west2"]
    with pytest.raises(InputError, match="regions"):
        at.signal_regions(at.task_settings({"regions": ["mars-1"]}))


def test_a_poll_writes_the_store_and_the_trace_dir(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.model import SignalKind
    from orchestrator.signals.poll import read_samples
    from orchestrator.signals.traces import read_trace

    s = settings(home, sources=["uk-carbon"])
    now = datetime.now(UTC)
    with uk_carbon_server() as url:
        monkeypatch.setenv("HELIOTROPE_UK_CARBON_URL", url)
        out = at.poll_signals(s, family="carbon", region="aws:eu-west-2", now=now)
    assert out["rows"] > 0 and out["sources"][0]["status"] == "ok"
    assert len(read_samples(s.trace_dir)) == out["rows"]
    assert len(read_trace(s.trace_dir).grid) > 0
    store = at._open_store()
    lo = (now - timedelta(days=2)).timestamp()
    assert store.samples(SignalKind.CARBON, ["GB"], lo, now.timestamp() + 86400)
    store.close()


def test_require_polled_decides_only_on_fresh_polled_signals(home: Path) -> None:
    """`rebalance(require_polled=True)` reads the live view's frame: a scenario, a frame on
    priors alone, or a polled sample older than signal_max_age_s is a reason to skip."""
    import numpy as np

    from orchestrator.live.world import local_world
    from orchestrator.signals.view import SignalBasis, SignalFrame

    with pytest.raises(at.Skip, match="scenario, not polled"):
        at.rebalance(settings(home), require_polled=True)

    grid = local_world().grid
    assert grid is not None
    n = len(grid.offers)

    def frame(sources: list[str], ages: list[float], stale: tuple[str, ...] = ()) -> SignalFrame:
        basis = SignalBasis(
            source={"carbon": tuple(sources)}, age_s={"carbon": np.array(ages, dtype=float)}
        )
        return SignalFrame(grid, 0, stale, basis)

    nan = float("nan")
    assert at.polled_reasons(frame(["prior: yearly"] * n, [nan] * n), 3600.0) == [
        "no polled signal counts now (every offer is on its priors)"
    ]
    fresh = frame(["uk-carbon"] + ["prior: yearly"] * (n - 1), [600.0] + [nan] * (n - 1))
    assert at.polled_reasons(fresh, 3600.0) == []
    (old,) = at.polled_reasons(fresh, 300.0)
    assert old.startswith(f"carbon of {grid.offers[0].id} from uk-carbon, 10 min old")
    stale = frame(["prior: yearly"] * n, [nan] * n, ("signals are stale: nothing counts",))
    assert at.polled_reasons(stale, 3600.0) == ["nothing counts"]


def test_a_poll_skips_what_it_cannot_poll(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = settings(home)
    with pytest.raises(at.Skip, match="aws sources do not cover gcp:europe-west4"):
        at.poll_signals(s, family="aws", region="gcp:europe-west4")
    with pytest.raises(at.Skip, match="covers"):
        at.poll_signals(
            settings(home, sources=["uk-carbon"]), family="carbon", region="aws:us-east-1"
        )
    monkeypatch.delenv("ELECTRICITYMAPS_TOKEN", raising=False)
    monkeypatch.delenv("WATTTIME_USERNAME", raising=False)
    with pytest.raises(at.Skip, match="no credentials for electricitymaps"):
        at.poll_signals(
            settings(home, sources=["electricitymaps"]),
            family="carbon",
            region="aws:us-east-1",
            credentials={},
        )


def test_a_poll_that_reads_nothing_fails_for_a_retry(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with uk_carbon_server() as url:
        monkeypatch.setenv("HELIOTROPE_UK_CARBON_URL", url + "/malformed")
        with pytest.raises(at.PollFailed, match="malformed"):
            at.poll_signals(
                settings(home, sources=["uk-carbon"]), family="carbon", region="gcp:europe-west2"
            )


# -- migrate -------------------------------------------------------------------------------


def test_a_dry_run_plans_and_changes_nothing(submitted: str, home: Path) -> None:
    plan = at.migrate(settings(home), job=submitted, region="europe-west4", dry_run=True)
    assert plan["to"].startswith("gcp:europe-west4") and plan["started"] is False
    assert plan["hours_to_finish"] == pytest.approx(0.1 + 4.0, abs=0.01)
    from orchestrator.live.commands import events_table, jobs_table
    from orchestrator.live.world import local_world

    store = local_world().open_store()
    assert events_table(store, submitted) == []
    assert jobs_table(store)[0]["phase"] == "pending"


def test_a_real_run_starts_the_move_through_the_controller(submitted: str, home: Path) -> None:
    plan = at.migrate(settings(home), job=submitted, region="europe-west4", dry_run=False)
    assert plan["started"] is True
    (row,) = plan["fleet"]
    assert row["where"].startswith("gcp:europe-west4") and row["phase"] == "starting"
    # A second move, from where it now runs: a migration through the machine.
    plan = at.migrate(settings(home), job=submitted, region="us-east-1", dry_run=False)
    from orchestrator.live.world import local_world

    (move,) = local_world().open_store().open_migrations(submitted)
    assert move.src_offer_id is not None and move.src_offer_id.startswith("gcp:europe-west4")
    assert move.dst_offer_id.startswith("aws:us-east-1")


@pytest.mark.parametrize(
    ("kwargs", "argv"),
    [
        ({"job": "nope", "region": "us-east-1"}, ["migrate", "nope", "--to", "us-east-1"]),
        ({"job": "lm", "region": "mars-1"}, ["migrate", "lm", "--to", "mars-1"]),
    ],
)
def test_refusals_are_the_clis_word_for_word(
    submitted: str,
    home: Path,
    kwargs: dict[str, Any],
    argv: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(InputError) as refused:
        at.migrate(settings(home), dry_run=True, **kwargs)
    capsys.readouterr()
    assert main([*argv, "--dry-run"]) == 2
    assert str(refused.value) in " ".join(capsys.readouterr().err.split())


def test_a_move_past_the_deadline_is_refused_unless_forced(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.live.commands import submit

    submit(write_jobs(tmp_path / "jobs.yaml", work_gpu_hours=9.95, deadline_h=10))
    with pytest.raises(InputError, match="after the deadline") as refused:
        at.migrate(settings(home), job="lm", region="eu-north-1", dry_run=True)
    assert "--force" in str(refused.value)
    assert main(["migrate", "lm", "--to", "eu-north-1", "--dry-run"]) == 2
    # The same words; the hours late differ: the scenario clock moved on in between.
    assert numbers_out(str(refused.value)) in numbers_out(capsys.readouterr().err)
    plan = at.migrate(settings(home), job="lm", region="eu-north-1", dry_run=True, force=True)
    assert plan["refused"] and "after the deadline" in plan["refused"][0]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"job": "", "region": "us-east-1"}, "job"),
        ({"job": "lm", "region": " "}, "region"),
        ({"job": "lm", "region": "us-east-1", "market": "reserved"}, "market"),
    ],
)
def test_bad_params_are_refused(
    submitted: str, home: Path, kwargs: dict[str, Any], words: str
) -> None:
    with pytest.raises(InputError, match=words):
        at.migrate(settings(home), **kwargs)


# -- rebalance -----------------------------------------------------------------------------


def test_rebalance_is_one_controller_tick(submitted: str, home: Path) -> None:
    out = at.rebalance(settings(home))
    assert [r["job"] for r in out["fleet"]] == [submitted]
    assert out["events"], "the first tick places (or pauses) the new job"
    assert all(e["job"] == submitted for e in out["events"])


def test_rebalance_skips_when_the_scenario_signals_have_ended(submitted: str, home: Path) -> None:
    (home / "config.yaml").write_text(yaml.safe_dump({"days": 1, "signals": "scenario"}))
    # Scenario time began an hour ago at 600x: 25 days in, past the 1-day signal grid.
    origin = datetime.now(UTC) - timedelta(hours=1)
    (home / "clock.json").write_text(json.dumps({"real_origin": origin.isoformat()}))
    with pytest.raises(at.Skip, match="signals are stale") as skip:
        at.rebalance(settings(home))
    assert "config.yaml" in skip.value.reason


# -- replay --------------------------------------------------------------------------------


def replay_jobs(path: Path) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "jobs": [
                    {
                        "name": "sweep",
                        "count": 2,
                        "work_gpu_hours": 3,
                        "gpus": 1,
                        "gpu_types": ["A100-80GB", "L4"],
                        "start_offset_h": 2,
                        "deadline_h": 30,
                        "home_region": "us-central1",
                    },
                    {
                        "name": "late",
                        "work_gpu_hours": 2,
                        "gpus": 1,
                        "gpu_types": ["L4"],
                        "start_offset_h": 40,
                        "deadline_h": 6,
                        "home_region": "us-central1",
                    },
                ]
            }
        )
    )
    return path


def test_replay_writes_the_report_and_returns_its_path(
    home: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="orchestrator.airflow_tasks")
    out = at.replay(
        settings(home),
        jobs_file=str(replay_jobs(tmp_path / "jobs.yaml")),
        run_id="manual__2024-04-01T00:00:00+00:00",
        policies=["on-demand", "carbon-greedy"],
        carbon_price=100.0,
        window_start="2024-04-01T00:00:00Z",
        window_days=1.5,
    )
    report = Path(out["report"])
    assert report.is_file() and report.parent.parent == home / "replays"
    assert f"replay report: {report}" in caplog.text
    res = json.loads(Path(out["results"]).read_text())
    assert res["config"]["jobs"] == 2, "the job starting after the window is left out"
    assert set(out["policies"]) == {"on-demand", "carbon-greedy"}
    assert out["policies"]["carbon-greedy"]["kg_co2"] < out["policies"]["on-demand"]["kg_co2"]
    json.dumps(out)  # an XCom: plain JSON


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"policies": ["on-demand", "nope"]}, "nope"),
        ({"policies": []}, "at least one policy"),
        ({"carbon_price": -1.0}, "carbon_price"),
        ({"window_start": "yesterday"}, "ISO 8601"),
        ({"window_start": "2024-04-05T00:00:00Z", "window_days": 0.05}, "window"),
        ({"tick_minutes": 0.001}, "tick_minutes"),
    ],
)
def test_bad_replay_params_are_refused(
    home: Path, tmp_path: Path, kwargs: dict[str, Any], words: str
) -> None:
    with pytest.raises(InputError, match=words):
        at.replay(settings(home), jobs_file=str(replay_jobs(tmp_path / "j.yaml")), **kwargs)


def test_constants_offered_in_the_forms_match_the_code() -> None:
    from orchestrator.live.world import LOCAL_REGIONS
    from orchestrator.replay.service import DEFAULT_POLICIES
    from policies.registry import POLICY_NAMES

    assert tuple(r for r, _ in LOCAL_REGIONS) == at.LOCAL_REGION_NAMES
    assert tuple(POLICY_NAMES) == at.REPLAY_POLICY_CHOICES
    assert at.DEFAULT_REPLAY_POLICIES == DEFAULT_POLICIES
    assert set(at.DEFAULT_REPLAY_POLICIES) <= set(POLICY_NAMES)
    assert at.signal_families() == dict(at.SIGNAL_FAMILIES)


def test_a_poll_without_network_is_skipped_with_the_reason(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of the box (no route to the source) the signals task is yellow, not red."""
    import socket

    with socket.socket() as sock:  # a port nothing listens on: connection refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("HELIOTROPE_UK_CARBON_URL", f"http://127.0.0.1:{port}")
    with pytest.raises(at.Skip, match="no network to uk-carbon"):
        at.poll_signals(
            settings(home, sources=["uk-carbon"]), family="carbon", region="gcp:europe-west2"
        )
