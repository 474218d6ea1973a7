"""A suite run's files: results.json and the cost-vs-carbon plot."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.replay.suites.results import SuiteResult


def write_suite_outputs(result: SuiteResult, out_dir: Path) -> dict[str, Path]:
    """`results.json` and `pareto.png` (mean USD vs kgCO2 per job, one point per policy and
    setting) in `out_dir`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / "results.json"
    results.write_text(json.dumps(result.to_json(), indent=2))
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    settings = result.settings()
    for policy in result.policies:
        xs = [result.policy(policy, s).mean_usd_per_job for s in settings]
        ys = [result.policy(policy, s).mean_kg_co2_per_job for s in settings]
        ax.plot(xs, ys, marker="o", linestyle="-" if len(xs) > 1 else "", label=policy)
    ax.set_xlabel("USD per job")
    ax.set_ylabel("kgCO2 per job (location-based)")
    ax.set_title(
        f"{result.suite}: cost vs carbon per policy"
        + (" (one point per setting)" if len(settings) > 1 else "")
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    pareto = out_dir / "pareto.png"
    fig.savefig(pareto)
    plt.close(fig)
    return {"results": results, "pareto": pareto}
