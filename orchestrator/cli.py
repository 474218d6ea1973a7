"""The `heliotrope` command line.

Exit status: 0 success, 2 bad input (the message names the file, field and fix; nothing is
written), 1 anything else. Progress bars go to stderr, so `--json` output stays clean.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from orchestrator import __version__
from orchestrator.errors import HeliotropeError, InputError

logger = logging.getLogger("heliotrope")
err_console = Console(stderr=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from orchestrator.signals.sources.http import redact_logs

    redact_logs()  # no credential in any log line, botocore's DEBUG lines included
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args))
    except InputError as exc:
        _say("error", exc)
        return 2
    except HeliotropeError as exc:
        _say("failed", exc)
        return 1
    except BrokenPipeError:  # `heliotrope status --json | head`: the reader left, fine
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (IsADirectoryError, NotADirectoryError, FileExistsError, PermissionError) as exc:
        where = exc.filename or ""
        _say("error", f"{where}: {exc.strerror}; nothing was written (pick another path)")
        return 2
    except (OverflowError, UnicodeDecodeError) as exc:
        _say(
            "error",
            f"{type(exc).__name__}: {exc}; check the numbers and the file's encoding (UTF-8)",
        )
        return 2


def _say(word: str, what: object) -> None:
    """An error line on stderr; the message is printed as text (a `[python, train.py]` in it
    is not rich markup)."""
    from rich.markup import escape

    err_console.print(f"[bold red]{word}:[/] {escape(str(what))}", highlight=False, soft_wrap=True)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="heliotrope",
        description="Carbon- and cost-aware orchestration of checkpointed GPU training jobs.",
    )
    p.add_argument("--version", action="version", version=f"heliotrope {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log every decision")
    sub = p.add_subparsers(title="commands")

    _add_replay_command(sub)
    _add_trace_commands(sub)
    _add_job_commands(sub)
    _add_fleet_commands(sub)
    _add_controller_commands(sub)
    _add_bench_commands(sub)
    return p


def _add_replay_command(sub: Any) -> None:
    """The offline replay."""
    r = sub.add_parser("replay", help="replay policies over a trace and report cost and carbon")
    r.add_argument("--traces", type=Path, help="trace directory (default: the built-in scenario)")
    r.add_argument("--jobs", type=Path, required=True, help="jobs file (docs/jobs.md)")
    r.add_argument(
        "--policies",
        help="comma-separated policy names (default: heliotrope and the five baselines)",
    )
    r.add_argument(
        "--carbon-price",
        type=_finite,
        default=0.0,
        metavar="USD_PER_TONNE",
        help="price of carbon in the objective (0 = pure cost)",
    )
    r.add_argument("--seed", type=int, default=0, help="seed for spot gaps and the scenario")
    r.add_argument("--tick-minutes", type=_finite, default=10.0, help="tick length")
    r.add_argument(
        "--days",
        type=_finite,
        default=14.0,
        help="length of the built-in scenario when --traces is not given",
    )
    r.add_argument(
        "--since",
        type=_utc_arg,
        default=None,
        metavar="ISO",
        help="when the jobs' start_offset_h counts from (default: the trace's start)",
    )
    r.add_argument(
        "--until",
        type=_utc_arg,
        default=None,
        metavar="ISO",
        help="replay only jobs that start before this time",
    )
    r.add_argument("--out", type=Path, default=Path("replay-out"), help="output directory")
    r.add_argument("--json", action="store_true", help="print results.json to stdout")
    r.set_defaults(handler=_replay)


def _add_trace_commands(sub: Any) -> None:
    """Trace directories, and the signal commands."""
    t = sub.add_parser("traces", help="create trace directories")
    tsub = t.add_subparsers(title="trace commands")
    ti = tsub.add_parser("import", help="convert ../shared/data style datasets into a trace")
    ti.add_argument("data_dir", type=Path)
    ti.add_argument("--out", type=Path, required=True)
    ti.set_defaults(handler=_traces_import)
    tg = tsub.add_parser("generate", help="generate the built-in seeded scenario")
    tg.add_argument("--seed", type=int, default=0)
    tg.add_argument("--days", type=_finite, default=14.0)
    tg.add_argument(
        "--start",
        type=datetime.fromisoformat,
        default=None,
        help="ISO start time (default 2024-04-01T00:00Z)",
    )
    tg.add_argument("--out", type=Path, required=True)
    tg.set_defaults(handler=_traces_generate)
    _add_signal_commands(sub, tsub)

    pol = sub.add_parser("policies", help="list the policies")
    pol.set_defaults(handler=_policies)


def _add_job_commands(sub: Any) -> None:
    """Live jobs: submit, inspect, cancel, hold."""
    jobs = sub.add_parser("jobs", help="submit and inspect live jobs")
    jsub = jobs.add_subparsers(title="job commands")
    js = jsub.add_parser("submit", help="submit the jobs of a jobs file")
    js.add_argument("file", type=Path)
    js.set_defaults(handler=_jobs_submit)
    jl = jsub.add_parser("list", help="every job, where it runs, progress, spend")
    jl.add_argument("--json", action="store_true")
    jl.set_defaults(handler=_status)
    jw = jsub.add_parser("show", help="one job and its events")
    jw.add_argument("job")
    jw.add_argument("--json", action="store_true")
    jw.set_defaults(handler=_jobs_show)
    jc = jsub.add_parser("cancel", help="stop a job for good (its checkpoints are kept)")
    jc.add_argument("job")
    jc.add_argument("--json", action="store_true")
    jc.set_defaults(handler=_jobs_cancel)
    jh = jsub.add_parser("hold", help="keep a job where it runs: the policy does not move it")
    jh.add_argument("job")
    jh.add_argument(
        "--hours", type=float, default=None, help="how long (default: until `jobs release`)"
    )
    jh.set_defaults(handler=_jobs_hold)
    jr = jsub.add_parser("release", help="end a hold: the policy may move the job again")
    jr.add_argument("job")
    jr.set_defaults(handler=_jobs_release)


def _add_fleet_commands(sub: Any) -> None:
    """The live fleet: status, events, explain, migrate, logs, cost, preempt."""
    st = sub.add_parser("status", help="the fleet: job, where, market, progress, USD, kgCO2")
    st.add_argument("--json", action="store_true")
    st.set_defaults(handler=_status)

    ev = sub.add_parser("events", help="a job's event history")
    ev.add_argument("job")
    ev.add_argument("--json", action="store_true")
    ev.set_defaults(handler=_events)

    ex = sub.add_parser(
        "explain", help="why a job runs where it does: each decision and the signals it was made on"
    )
    ex.add_argument("job")
    ex.set_defaults(handler=_explain)

    mg = sub.add_parser("migrate", help="move a job to another region, through the same machine")
    mg.add_argument("job")
    mg.add_argument("--to", required=True, metavar="REGION")
    mg.add_argument("--market", choices=["spot", "on_demand"], default=None)
    mg.add_argument("--dry-run", action="store_true")
    mg.add_argument(
        "--force",
        action="store_true",
        help="move even if it misses the deadline or breaks the budget",
    )
    mg.add_argument(
        "--hold",
        type=float,
        default=None,
        metavar="HOURS",
        help="then keep it there this long (the policy does not move it back)",
    )
    mg.add_argument("--json", action="store_true")
    mg.set_defaults(handler=_migrate)

    lg = sub.add_parser(
        "logs",
        help="a job's output, of its current or last instance: local world, its stdout.log; "
        "AWS, its EC2 console output; GCP, its serial port 1",
    )
    lg.add_argument("job")
    lg.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="keep printing until the job is done or cancelled (Ctrl-C stops)",
    )
    lg.set_defaults(handler=_logs)

    cr_ = sub.add_parser(
        "cost-report",
        help="what the fleet spent and emitted, per job, region and market, against on-demand",
    )
    cr_.add_argument(
        "--since", type=_utc_arg, default=None, metavar="ISO", help="from this time (default: ever)"
    )
    cr_.add_argument("--json", action="store_true")
    cr_.set_defaults(handler=_cost_report)

    pr = sub.add_parser("preempt", help="preempt a local job's instance (as a spot reclaim)")
    pr.add_argument("job")
    pr.set_defaults(handler=_preempt)


def _add_controller_commands(sub: Any) -> None:
    """The controller, the clouds and their offers."""
    ct = sub.add_parser("controller", help="run the live controller")
    csub = ct.add_subparsers(title="controller commands")
    cr = csub.add_parser("run", help="tick until stopped (or --once / --until-done)")
    cr.add_argument("--once", action="store_true")
    cr.add_argument("--until-done", action="store_true")
    cr.add_argument(
        "--interval", type=_finite, default=None, metavar="S", help="scenario seconds between ticks"
    )
    cr.set_defaults(handler=_controller_run)

    pv = sub.add_parser("providers", help="cloud providers (clouds.yaml, docs/providers.md)")
    pvsub = pv.add_subparsers(title="provider commands")
    pc = pvsub.add_parser("check", help="credentials and permissions of each configured cloud")
    pc.add_argument("--cloud", default=None, metavar="aws,gcp", help="only these clouds")
    pc.add_argument(
        "--config",
        type=Path,
        default=None,
        help="cloud settings (default: $HELIOTROPE_HOME/clouds.yaml)",
    )
    pc.add_argument("--json", action="store_true")
    pc.set_defaults(handler=_providers_check)

    of = sub.add_parser("offers", help="GPU offers across clouds, cheapest first, with carbon")
    of.add_argument("--gpu", default=None, help="a GPU type, e.g. A100 (both sizes) or L4")
    of.add_argument("--market", choices=["spot", "on_demand", "on-demand"], default=None)
    of.add_argument("--cloud", default=None, metavar="aws,gcp", help="only these clouds")
    of.add_argument(
        "--traces",
        type=Path,
        default=None,
        help="trace directory with hourly grid carbon (default: the settings')",
    )
    of.add_argument(
        "--config",
        type=Path,
        default=None,
        help="cloud settings (default: $HELIOTROPE_HOME/clouds.yaml)",
    )
    of.add_argument("--json", action="store_true")
    of.set_defaults(handler=_offers)


def _add_bench_commands(sub: Any) -> None:
    """Benchmark suites and the demo."""
    bn = sub.add_parser("bench", help="benchmark suites")
    bsub = bn.add_subparsers(title="bench commands")
    bp = bsub.add_parser("policies", help="policies against the hindsight oracle on a suite")
    bp.add_argument("--suite", required=True, help="skynomad-h100 | cbl-v100 | carbon-year")
    bp.add_argument("--policies", default="heliotrope,spot-failover,uniform-progress")
    bp.add_argument(
        "--data",
        type=Path,
        default=None,
        help="shared traces (default $HELIOTROPE_TRACES or ../shared/data)",
    )
    bp.add_argument("--zones", default=None, help="comma-separated zones")
    sweep = "one value or a comma list (lists run their cross product)"
    bp.add_argument("--deadline-ratio", default=None, help=sweep)
    bp.add_argument("--work-hours", default=None, help=sweep)
    bp.add_argument("--cold-start-hours", default=None, help=sweep)
    bp.add_argument("--checkpoint-gb", default=None, help=sweep)
    bp.add_argument("--slack-hours", default=None, help="cbl-v100: " + sweep)
    bp.add_argument(
        "--egress-usd-per-gb", default=None, help="one price for every cross-region checkpoint move"
    )
    bp.add_argument(
        "--transfer-gbps",
        default=None,
        help="checkpoint copies take time at this bandwidth (Gbit/s)",
    )
    bp.add_argument(
        "--timeline",
        default=None,
        metavar="JOB[@WINDOW]",
        help="print one job's per-tick placement per policy beside the oracle's",
    )
    bp.add_argument("--start-ticks", default=None, help="comma-separated window starts")
    bp.add_argument(
        "--drop-finishing-tick", action="store_true", help="report SkyNomad's published convention"
    )
    bp.add_argument("--carbon-prices", default=None, help="carbon-year: USD/t, a comma list")
    bp.add_argument("--windows", type=int, default=None, help="carbon-year: windows")
    bp.add_argument("--jobs-per-window", type=int, default=None, help="carbon-year: jobs each")
    bp.add_argument("--seed", type=int, default=None, help="carbon-year: job generator seed")
    bp.add_argument(
        "--spot-loss-per-hour",
        default=None,
        help="carbon-year: the seeded spot hazard's rate of loss (default 0.1; 0: always up)",
    )
    bp.add_argument(
        "--jobs-alone",
        action="store_true",
        help="carbon-year: replay each job by itself on its window's world (no contention)",
    )
    bp.add_argument(
        "--oracle-from",
        type=Path,
        default=None,
        metavar="RESULTS_JSON",
        help="read the oracle's rows from an earlier run's results.json of the same suite and "
        "options instead of running it (policy variants in seconds)",
    )
    bp.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes to spread the suite's windows over (default 1)",
    )
    bp.add_argument("--out", type=Path, default=Path("bench-out"))
    bp.add_argument("--json", action="store_true")
    bp.set_defaults(handler=_bench_policies)

    bb = bsub.add_parser(
        "bound",
        help="carbon-year: the online optimum on the spot hazard against the clairvoyant one",
    )
    bb.add_argument("--data", type=Path, default=None, help="shared traces (as bench policies)")
    bb.add_argument("--windows", type=int, default=None, help="windows (default 10)")
    bb.add_argument("--jobs-per-window", type=int, default=None, help="jobs each (default 20)")
    bb.add_argument("--seed", type=int, default=None, help="job generator seed (default 0)")
    bb.add_argument(
        "--spot-loss-per-hour", default=None, help="the seeded spot hazard's rate of loss"
    )
    bb.add_argument(
        "--carbon-price", default="0", help="USD/t: J = dollars + price x tCO2 (default 0)"
    )
    bb.add_argument("--offers", type=int, default=6, help="spot offers per job (2**N states)")
    bb.add_argument("--samples", type=int, default=150, help="availability paths per job")
    bb.add_argument(
        "--continuous",
        action="store_true",
        help="a preemption loses no work (default: each job's own checkpoint interval)",
    )
    bb.add_argument("--workers", type=int, default=1, help="processes (default 1)")
    bb.add_argument("--json", action="store_true")
    bb.set_defaults(handler=_bench_bound)

    dm = sub.add_parser("demo", help="the live demo: local jobs moved by the policy, then a replay")
    dm.add_argument("--home", type=Path, default=Path("out/demo"))
    dm.add_argument("--steps", type=int, default=144, help="training steps per job")
    dm.set_defaults(handler=_demo)


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=False,
    )


def _policies(args: argparse.Namespace) -> int:
    import shutil
    import textwrap

    from policies.registry import POLICY_NAMES, make_policy

    width = max(60, min(shutil.get_terminal_size((100, 24)).columns, 120))
    for name in POLICY_NAMES:
        # The docstring's first paragraph, whole, wrapped under its name.
        first = (type(make_policy(name)).__doc__ or "").strip().split("\n\n")[0]
        print(
            textwrap.fill(
                " ".join(first.split()),
                width=width,
                initial_indent=f"{name:24s} ",
                subsequent_indent=" " * 25,
            )
        )
    return 0


def _replay(args: argparse.Namespace) -> int:
    from orchestrator.replay.report import format_table, summary
    from orchestrator.replay.service import DEFAULT_POLICIES, ReplayRequest, replay

    request = ReplayRequest(
        jobs_file=args.jobs,
        out_dir=args.out,
        policies=DEFAULT_POLICIES if args.policies is None else tuple(args.policies.split(",")),
        traces=args.traces,
        scenario_days=args.days,
        anchor=args.since,
        keep_until=args.until,
        carbon_usd_per_tonne=args.carbon_price,
        seed=args.seed,
        tick_minutes=args.tick_minutes,
    )
    with _progress() as bar:
        tasks: dict[str, Any] = {}

        def report(policy: str, done: int, total: int) -> None:
            if policy not in tasks:
                tasks[policy] = bar.add_task(f"replay {policy}", total=total)
            bar.update(tasks[policy], completed=done)

        result = replay(request, progress=report)
    res = result.results
    if args.json:
        print(json.dumps({"policies": res["policies"], "config": res["config"]}, indent=2))
        return 0
    out = Console()
    if not out.is_terminal:
        out = Console(width=160)  # logs and pipes: never squeeze the table
    out.print(format_table(res))
    out.print(summary(res), markup=False, highlight=False)
    out.print(f"report: {result.report}", markup=False)
    return 0


def _print_rows(rows: list[dict[str, Any]], as_json: bool, title: str) -> None:
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
        return
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(title), title_justify="left")
    for key in rows[0] if rows else ["(none)"]:
        table.add_column(escape(key))
    for row in rows:  # cells are text, not markup: a `[python, train.py]` stays as it is
        table.add_row(
            *[escape(f"{v:.3f}" if isinstance(v, float) else str(v)) for v in row.values()]
        )
    out = Console()
    if not out.is_terminal:
        out = Console(width=160)
    out.print(table)


def _jobs_submit(args: argparse.Namespace) -> int:
    from orchestrator.live.commands import submit

    ids = submit(args.file)
    print(f"submitted {len(ids)} job(s): {', '.join(ids)}")
    return 0


def _status(args: argparse.Namespace) -> int:
    from orchestrator.live.commands import jobs_table, status_context
    from orchestrator.live.world import open_configured_store

    offers, now_s = status_context()
    rows = jobs_table(open_configured_store(create=False), offers=offers, now_s=now_s)
    if args.json:
        _print_rows(rows, True, "")
        return 0
    when = datetime.fromtimestamp(now_s, UTC)
    _print_rows(
        [
            _human(r, drop=("held_until",) if not any(x["held_until"] for x in rows) else ())
            for r in rows
        ],
        False,
        f"Fleet at {when:%Y-%m-%d %H:%M} UTC",
    )
    return 0


def _human(row: dict[str, Any], drop: Sequence[str] = ()) -> dict[str, Any]:
    """A row for people: ISO times as ``2024-04-02 16:00`` (UTC), fractions as percents."""
    out: dict[str, Any] = {}
    for key, raw in row.items():
        if key in drop or key == "time_s":
            continue
        value = raw
        if key == "progress" and isinstance(raw, float):
            value = f"{raw:.0%}"
        elif isinstance(raw, str) and len(raw) >= 16 and raw[4:5] == "-" and raw[10:11] == "T":
            with contextlib.suppress(ValueError):
                value = f"{datetime.fromisoformat(raw).astimezone(UTC):%Y-%m-%d %H:%M}"
        elif raw is None:
            value = ""
        out[key] = value
    return out


def _jobs_show(args: argparse.Namespace) -> int:
    from orchestrator.live.commands import events_table, jobs_table, status_context
    from orchestrator.live.world import open_configured_store

    store = open_configured_store(create=False)
    offers, now_s = status_context()
    rows = [r for r in jobs_table(store, offers=offers, now_s=now_s) if r["job"] == args.job]
    if not rows:
        raise InputError(
            "", "JOB", "a submitted job", got=repr(args.job), fix="see `heliotrope jobs list`"
        )
    if args.json:
        print(json.dumps({**rows[0], "events": events_table(store, args.job)}, indent=2))
        return 0
    _print_rows([_human(rows[0])], False, f"Job {args.job}")
    _print_rows([_human(r) for r in events_table(store, args.job)], False, "Events (times UTC)")
    return 0


def _events(args: argparse.Namespace) -> int:
    from orchestrator.live.commands import events_table
    from orchestrator.live.world import open_configured_store

    store = open_configured_store(create=False)
    if args.job not in {r.id for r in store.load()[0].jobs}:
        raise InputError(
            "", "JOB", "a submitted job", got=repr(args.job), fix="see `heliotrope jobs list`"
        )
    rows = events_table(store, args.job)
    _print_rows(
        rows if args.json else [_human(r) for r in rows],
        args.json,
        f"Events of {args.job} (times UTC)",
    )
    return 0


def _explain(args: argparse.Namespace) -> int:
    from orchestrator.live.commands import explain
    from orchestrator.live.world import open_configured_store

    lines = explain(open_configured_store(create=False), args.job)
    print("\n".join(lines) if lines else f"{args.job}: no placement decision yet")
    return 0


def _migrate(args: argparse.Namespace) -> int:
    from orchestrator.live.commands import migrate

    plan = migrate(
        args.job,
        args.to,
        market=args.market,
        dry_run=args.dry_run,
        force=args.force,
        hold_h=args.hold,
    )
    if args.json:
        print(json.dumps(plan, indent=2))
    else:
        verb = "started" if plan["started"] else "would move"
        print(
            f"{verb} {plan['job']} -> {plan['to']}: {plan['hours_to_finish']} h to finish, "
            f"{plan['usd_to_finish']} USD, egress {plan['egress_usd']} USD"
            + (f"; forced past: {'; '.join(plan['refused'])}" if plan["refused"] else "")
            + (f"; held there until {plan['held_until']}" if plan["held_until"] else "")
        )
    return 0


def _jobs_cancel(args: argparse.Namespace) -> int:
    from orchestrator.live.commands import cancel

    out = cancel(args.job)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        stopped = f"stopped instance {out['stopped']}" if out["stopped"] else "held no instance"
        where = f"; checkpoints kept at {out['checkpoint_at']}" if out["checkpoint_at"] else ""
        print(f"cancelled {out['job']} at {out['progress']:.0%}: {stopped}{where}")
    return 0


def _jobs_hold(args: argparse.Namespace) -> int:
    from orchestrator.live.commands import _iso, hold

    until = hold(args.job, args.hours)
    print(
        f"holding {args.job} where it runs "
        + (f"until {_iso(until)}" if args.hours else "until released")
    )
    return 0


def _jobs_release(args: argparse.Namespace) -> int:
    from orchestrator.live.commands import release

    was = release(args.job)
    print(f"released {args.job}" if was else f"{args.job} was not held")
    return 0


def _logs(args: argparse.Namespace) -> int:
    from orchestrator.live.commands import logs

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends --follow
        logs(args.job, write, follow=args.follow)
    return 0


def _cost_report(args: argparse.Namespace) -> int:
    from orchestrator.live.commands import cost_report

    report = cost_report(args.since)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    fleet = report["fleet"]
    since = report["since"] or "the first job"
    saved = (
        "no on-demand price now for some offer"
        if fleet["saved_pct"] is None
        else f"{fleet['saved_pct']:.1f}% less than on-demand ({fleet['on_demand_usd']:.2f} USD)"
    )
    print(
        f"From {since} to {report['until']}: {fleet['usd']:.2f} USD "
        f"(egress {fleet['egress_usd']:.2f}), {fleet['kg_co2']:.3f} kgCO2; {saved}"
    )
    _print_rows(report["jobs"], False, "Per job")
    _print_rows(report["by_place"], False, "By region and market")
    return 0


def _preempt(args: argparse.Namespace) -> int:
    from orchestrator.live.commands import preempt

    print(f"preempted {args.job} (instance {preempt(args.job)})")
    return 0


def _controller_run(args: argparse.Namespace) -> int:
    from orchestrator.live.commands import run

    def show(live: Any, events: list[Any]) -> None:
        for e in events:
            print(
                f"{live.clock.now():%Y-%m-%d %H:%M} {e.job_id:20s} {e.kind.value:10s} "
                f"{e.offer_id} {e.detail}",
                flush=True,
            )

    run(once=args.once, interval_s=args.interval, until_done=args.until_done, on_tick=show)
    return 0


def _providers_check(args: argparse.Namespace) -> int:
    from orchestrator.live.clouds import check_providers, load_cloud_settings, parse_clouds

    settings = load_cloud_settings(args.config)
    results = check_providers(settings, clouds=parse_clouds(args.cloud, settings))
    _print_rows([r.row() for r in results], args.json, "Provider checks")
    return 1 if any(r.result == "fail" for r in results) else 0


def _offers(args: argparse.Namespace) -> int:
    from orchestrator.live.clouds import (
        load_cloud_settings,
        offers_table,
        parse_clouds,
        parse_market,
    )

    settings = load_cloud_settings(args.config)
    rows, unpriced = offers_table(
        settings,
        clouds=parse_clouds(args.cloud, settings),
        gpu=args.gpu,
        market=parse_market(args.market),
        traces=args.traces,
    )
    if not args.json:
        from orchestrator.live.clouds import compact_offer_rows

        rows = compact_offer_rows(rows)
    _print_rows(rows, args.json, "Offers, cheapest first (USD per GPU-hour)")
    if unpriced:
        err_console.print(f"{unpriced} matching offer(s) without a known price left out")
    return 0


def _traces_dir(args: argparse.Namespace) -> Path:
    """--data, else $HELIOTROPE_TRACES, else ../shared/data."""
    return args.data or Path(os.environ.get("HELIOTROPE_TRACES", "../shared/data"))


def _given(options: dict[str, Any]) -> dict[str, Any]:
    """The suite options the user gave (None: the suite's default)."""
    return {k: v for k, v in options.items() if v is not None}


def _bench_policies(args: argparse.Namespace) -> int:
    from orchestrator.replay.suites import run_suite, write_suite_outputs

    data = _traces_dir(args)

    # Values and comma lists go to the suite as given: it parses and checks them.
    overrides = _given(
        {
            "zones": args.zones,
            "deadline_ratio": args.deadline_ratio,
            "work_hours": args.work_hours,
            "cold_start_hours": args.cold_start_hours,
            "checkpoint_gb": args.checkpoint_gb,
            "slack_hours": args.slack_hours,
            "egress_usd_per_gb": args.egress_usd_per_gb,
            "transfer_gbps": args.transfer_gbps,
            "start_ticks": args.start_ticks,
            "drop_finishing_tick": True if args.drop_finishing_tick else None,
            "carbon_prices": args.carbon_prices,
            "windows": args.windows,
            "jobs_per_window": args.jobs_per_window,
            "seed": args.seed,
            "spot_loss_per_hour": args.spot_loss_per_hour,
            "jobs_alone": True if args.jobs_alone else None,
        }
    )
    if args.timeline:
        from orchestrator.replay.suites import suite_timelines

        job, _, window = args.timeline.partition("@")
        for timeline in suite_timelines(
            args.suite,
            data,
            args.policies.split(","),
            overrides,
            job.strip(),
            window.strip() or None,
        ):
            print(timeline.format() + "\n")
        return 0
    with _progress() as bar:
        task = bar.add_task(f"bench {args.suite}", total=None)

        def step(label: str, done: int, total: int) -> None:
            bar.update(task, description=f"bench {label}", completed=done, total=total)

        result = run_suite(
            args.suite,
            data,
            args.policies.split(","),
            overrides,
            progress=step,
            workers=args.workers,
            oracle_from=args.oracle_from,
        )
    paths = write_suite_outputs(result, args.out)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print(result.format_table())
        print(f"results: {paths['results']}\nplot: {paths['pareto']}")
    return 0


def _bench_bound(args: argparse.Namespace) -> int:
    from orchestrator.replay.suites.hazard_jobs import carbon_year_bounds, window_rows

    overrides = _given(
        {
            "windows": args.windows,
            "jobs_per_window": args.jobs_per_window,
            "seed": args.seed,
            "spot_loss_per_hour": args.spot_loss_per_hour,
            "carbon_prices": args.carbon_price,
        }
    )
    try:
        price = float(args.carbon_price)
    except ValueError:
        price = -1.0
    if not price >= 0:
        raise InputError(
            "", "--carbon-price", "one number of USD/t, 0 or more", got=args.carbon_price
        )
    if not 1 <= args.offers <= 8:
        raise InputError("", "--offers", "a whole number from 1 to 8", got=args.offers)
    if args.samples < 1:
        raise InputError("", "--samples", "a whole number >= 1", got=args.samples)
    if args.workers < 1:
        raise InputError("", "--workers", "a whole number >= 1", got=args.workers)
    with _progress() as bar:
        task = bar.add_task("bound carbon-year", total=None)

        def step(done: int, total: int) -> None:
            bar.update(
                task, description=f"bound: window {done}/{total}", completed=done, total=total
            )

        bounds = carbon_year_bounds(
            _traces_dir(args),
            overrides,
            offers=args.offers,
            samples=args.samples,
            continuous=args.continuous,
            workers=args.workers,
            progress=step,
        )
    _print_rows(
        window_rows(bounds),
        args.json,
        f"carbon-year at {args.carbon_price} USD/t: online optimum / clairvoyant (J)",
    )
    return 0


def _demo(args: argparse.Namespace) -> int:
    from orchestrator.live.demo import run_demo

    return run_demo(args.home, steps=args.steps)


def _traces_import(args: argparse.Namespace) -> int:
    from orchestrator.signals.importers import DATASETS, import_shared_data
    from orchestrator.signals.traces import write_trace

    with _progress() as bar:
        task = bar.add_task("import", total=len(DATASETS) + 1)  # each dataset, then merging

        def step(label: str) -> None:
            bar.update(task, description=f"import {label}", advance=1)

        trace = import_shared_data(args.data_dir, progress=step)
    write_trace(trace, args.out)
    rows = {name: len(getattr(trace, name)) for name in ("offers", "prices", "spot", "grid")}
    print(f"wrote {args.out}: " + ", ".join(f"{v:,} {k}" for k, v in rows.items()))
    return 0


def _traces_generate(args: argparse.Namespace) -> int:
    from orchestrator.signals.scenario import generate
    from orchestrator.signals.traces import write_trace

    if args.days <= 0:
        raise InputError("", "--days", "a positive number of days", got=args.days)
    kwargs = {"start": args.start} if args.start else {}
    trace = generate(args.seed, args.days, **kwargs)
    write_trace(trace, args.out)
    print(f"wrote {args.out}: {len(trace.offers)} offers, {args.days:g} days, seed {args.seed}")
    return 0


# -- live signals (orchestrator.signals.poll, imported lazily) ------------------------------


def _add_signal_commands(sub: Any, tsub: Any) -> None:
    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument(
            "--region",
            action="append",
            default=[],
            metavar="CLOUD:REGION",
            help="only these regions (repeatable; default every AWS and GCP region)",
        )
        q.add_argument(
            "--db", default=None, metavar="URL", help="also append the samples to this state store"
        )
        q.add_argument("--json", action="store_true")

    sg = sub.add_parser("signals", help="poll live prices, spot capacity, carbon, curtailment")
    ssub = sg.add_subparsers(title="signal commands")
    sp = ssub.add_parser("poll", help="read live sources now; append to a trace dir / store")
    sp.add_argument(
        "--source",
        action="append",
        default=[],
        metavar="S",
        help="a source name (repeatable; default all; see docs/signals.md)",
    )
    sp.add_argument("--out", type=Path, default=None, help="trace directory to append to")
    sp.add_argument(
        "--now",
        type=_utc_arg,
        default=None,
        help="poll as of this ISO time (default: the clock; for tests and replays)",
    )
    common(sp)
    sp.set_defaults(handler=_signals_poll)
    ss = ssub.add_parser("status", help="freshness of what was recorded, per source and region")
    ss.add_argument("--out", type=Path, default=None, help="trace directory written by poll")
    ss.add_argument("--db", default=None, metavar="URL", help="state store to read samples from")
    ss.add_argument("--stale", action="store_true", help="show stale rows only")
    ss.add_argument("--now", type=_utc_arg, default=None, help="judge freshness at this time")
    ss.add_argument("--json", action="store_true")
    ss.set_defaults(handler=_signals_status)

    td = tsub.add_parser("download", help="backfill history of a live source into a trace")
    td.add_argument("--source", required=True, metavar="S")
    td.add_argument("--start", required=True, type=_utc_arg, help="ISO time (UTC if no offset)")
    td.add_argument("--end", required=True, type=_utc_arg, help="ISO time (UTC if no offset)")
    td.add_argument("--out", type=Path, required=True)
    common(td)
    td.set_defaults(handler=_traces_download)


def _finite(text: str) -> float:
    """A float argument that is a real number (not nan or inf)."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def _utc_arg(text: str) -> datetime:
    from orchestrator.clock import utc

    try:
        return utc(datetime.fromisoformat(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO time: {text!r}") from None


def _print_poll(report: Any, as_json: bool) -> int:
    rows = report.table()
    if as_json:
        print(
            json.dumps(
                {"now": report.now.isoformat(), "sources": rows, "store_error": report.store_error},
                indent=2,
            )
        )
    else:
        _print_rows(rows, False, f"Signals at {report.now:%Y-%m-%d %H:%M} UTC")
        if report.out is not None:
            print(f"trace: {report.out}")
        if report.store_error:
            print(f"state store: {report.store_error}")
    return 0 if report.ok else 1


def _signals_poll(args: argparse.Namespace) -> int:
    from orchestrator.clock import SystemClock
    from orchestrator.signals.poll import parse_regions, poll

    if args.out is None and args.db is None:
        raise InputError("", "--out / --db", "a trace directory, a state store or both")
    store = _open_signal_store(args.db)
    report = poll(
        args.source,
        args.out,
        now=args.now or SystemClock().now(),
        store=store,
        regions=parse_regions(args.region) or None,
    )
    return _print_poll(report, args.json)


def _signals_status(args: argparse.Namespace) -> int:
    from orchestrator.clock import SystemClock
    from orchestrator.signals.poll import freshness

    if args.out is None and args.db is None:
        raise InputError(
            "",
            "--out / --db",
            "a trace directory written by `signals poll`, a state store, or both",
        )
    rows = [
        r.as_dict()
        for r in freshness(
            args.out, _open_signal_store(args.db), now=args.now or SystemClock().now()
        )
    ]
    if args.stale:
        rows = [r for r in rows if r["stale"]]
    _print_rows(rows, args.json, "Signal freshness")
    return 0


def _traces_download(args: argparse.Namespace) -> int:
    from orchestrator.clock import SystemClock
    from orchestrator.signals.poll import download, parse_regions

    report = download(
        args.source,
        args.start,
        args.end,
        args.out,
        now=SystemClock().now(),
        store=_open_signal_store(args.db),
        regions=parse_regions(args.region) or None,
    )
    return _print_poll(report, args.json)


def _open_signal_store(url: str | None) -> Any:
    if url is None:
        return None
    from orchestrator.state import open_store

    return open_store(url)


if __name__ == "__main__":
    sys.exit(main())
