"""Scripted events on the scenario's signals (orchestrator/signals/events.py): each changes
what it names over its window and nothing else; bad events are refused naming the field;
the demo's events move a job because of the signal they script (replayed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from orchestrator.errors import InputError
from orchestrator.jobs import load_jobs
from orchestrator.live.commands import signal_reason
from orchestrator.live.demo import DEMO_EVENTS, demo_config, demo_jobs
from orchestrator.live.world import LiveSettings, load_settings, local_world
from orchestrator.loop import LoopOptions
from orchestrator.model import CostSettings, EventKind, Market
from orchestrator.replay.runner import run_policy
from orchestrator.signals.events import GridEvent, apply_events
from policies.registry import make_policy


@pytest.fixture
def grid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("HELIOTROPE_HOME", str(tmp_path))
    return local_world(LiveSettings(signals="scenario", days=1)).grid


def test_each_kind_changes_its_window_and_nothing_else(grid) -> None:  # type: ignore[no-untyped-def]
    events = [
        GridEvent(kind="carbon", region="us-central1", at_h=2, hours=3, g_per_kwh=900),
        GridEvent(kind="curtailment", region="europe-west4", at_h=1, hours=1, g_per_kwh=60),
        GridEvent(kind="reclaim", zone="eu-north-1a", at_h=0.5, hours=1),
        GridEvent(kind="spot_price", zone="us-east-1c", at_h=0, hours=2, factor=2.0),
    ]
    before = grid.spot_capacity.copy()
    out = apply_events(grid, events)
    k = lambda h: int(h * 3600 // grid.tick_s)  # noqa: E731
    central = [o for o, x in enumerate(grid.offers) if x.region == "us-central1"]
    assert (out.carbon_g_per_kwh[k(2) : k(5), central] == 900).all()
    assert (out.carbon_g_per_kwh[k(5) :, central] == grid.carbon_g_per_kwh[k(5) :, central]).all()
    nl = [o for o, x in enumerate(grid.offers) if x.region == "europe-west4"]
    assert out.curtailing[k(1) : k(2), nl].all() and not out.curtailing[k(2) :, nl].any()
    assert (out.carbon_marginal_g_per_kwh[k(1) : k(2), nl] == 0).all()
    spot_a = [
        o for o, x in enumerate(grid.offers) if x.zone == "eu-north-1a" and x.market is Market.SPOT
    ]
    assert (out.spot_capacity[k(0.5) : k(1.5), spot_a] == 0).all()
    other = [o for o in range(len(grid.offers)) if o not in spot_a]
    np.testing.assert_array_equal(out.spot_capacity[:, other], before[:, other])
    east = [
        o for o, x in enumerate(grid.offers) if x.zone == "us-east-1c" and x.market is Market.SPOT
    ]
    np.testing.assert_allclose(
        out.usd_per_hour[: k(2), east], 2.0 * grid.usd_per_hour[: k(2), east]
    )
    np.testing.assert_array_equal(grid.spot_capacity, before)  # the input is not changed


def test_an_event_naming_no_offer_is_refused(grid) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError) as err:
        apply_events(grid, [GridEvent(kind="reclaim", zone="eu-north-1z", at_h=0, hours=1)])
    assert "1.zone" not in str(err.value) and "0.zone" in str(err.value)
    assert "eu-north-1a" in str(err.value)  # the zones it could have named
    with pytest.raises(InputError, match=r"0\.at_h.*raise days") as err:  # scripts nothing
        apply_events(grid, [GridEvent(kind="reclaim", zone="eu-north-1a", at_h=99, hours=1)])


@pytest.mark.parametrize(
    ("events", "field"),
    [
        ([{"kind": "carbon", "region": "us-central1", "at_h": 1, "hours": 2}], "g_per_kwh"),
        ([{"kind": "reclaim", "region": "a", "zone": "b", "at_h": 1, "hours": 2}], "region"),
        ([{"kind": "reclaim", "zone": "b", "at_h": -1, "hours": 2}], "at_h"),
        ([{"kind": "heatwave", "zone": "b", "at_h": 1, "hours": 2}], "kind"),
    ],
)
def test_bad_events_in_config_name_the_field(
    tmp_path: Path, events: list[dict[str, object]], field: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"signals": "scenario", "events": events}))
    with pytest.raises(InputError) as err:
        load_settings(path)
    assert field in str(err.value) and "events" in str(err.value)


def test_events_need_the_scenario(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    events = [{"kind": "reclaim", "zone": "b", "at_h": 1, "hours": 2}]
    path.write_text(yaml.safe_dump({"signals": "polled", "events": events}))
    with pytest.raises(InputError, match="signals: scenario"):
        load_settings(path)


def test_the_demos_carbon_spike_moves_a_job_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replayed on the demo's own world: heliotrope takes a job out of us-central1 while the
    wind lull puts it at 900 g/kWh, the event names carbon as the reason, and without the
    events nothing runs there at 900 g/kWh."""
    monkeypatch.setenv("HELIOTROPE_HOME", str(tmp_path))
    settings = LiveSettings.model_validate(demo_config())
    assert len(settings.events) == len(DEMO_EVENTS)
    grid = local_world(settings).grid
    assert grid is not None
    jobs_file = tmp_path / "jobs.yaml"
    jobs_file.write_text(yaml.safe_dump(demo_jobs(144)))
    jobs = load_jobs(jobs_file, trace_start=grid.start)
    options = LoopOptions(
        cluster="t", settings=CostSettings(carbon_usd_per_tonne=settings.carbon_usd_per_tonne)
    )
    run = run_policy(make_policy("heliotrope"), jobs, grid, options=options)
    assert all(run.fleet.finished_at_s[j] <= jobs[j].deadline.timestamp() for j in range(3))
    reasons = [
        signal_reason(e.data)
        for e in run.events
        if e.kind is EventKind.LAUNCHED and "src_usd_per_hour" in e.data
    ]
    assert any(r.startswith("carbon 900 ->") for r in reasons), reasons


def test_where_heliotrope_loses_the_demo_says_by_how_much_and_on_which_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rich.console import Console

    from orchestrator.costs import objective_usd
    from orchestrator.live.demo import _print_loss
    from orchestrator.replay.service import replay_loaded

    monkeypatch.setenv("HELIOTROPE_HOME", str(tmp_path))
    settings = LiveSettings.model_validate(demo_config())
    grid = local_world(settings).grid
    assert grid is not None
    jobs_file = tmp_path / "jobs.yaml"
    jobs_file.write_text(yaml.safe_dump(demo_jobs(144)))
    jobs = load_jobs(jobs_file, trace_start=grid.start)
    done = replay_loaded(
        jobs,
        grid,
        ["heliotrope", "spot-failover"],
        tmp_path / "out",
        carbon_usd_per_tonne=settings.carbon_usd_per_tonne,
    )
    j = {
        r.policy: float(objective_usd(r.fleet.usd, r.fleet.kg_co2, 200.0).sum())
        for r in done.replay.runs
    }
    console = Console(record=True, width=400)
    _print_loss(console, done.replay, done.results)
    said = console.export_text()
    if j["heliotrope"] > j["spot-failover"]:
        assert f"heliotrope paid {j['heliotrope'] - j['spot-failover']:.2f} USD" in said
        assert "more than spot-failover" in said and "preempted" in said
    else:
        assert said == ""
