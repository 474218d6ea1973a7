"""A training script imports the SDK with torch and the standard library only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = (
    "airflow",
    "boto3",
    "botocore",
    "google",
    "sqlalchemy",
    "pandas",
    "s3fs",
    "gcsfs",
    "pyarrow",
    "pydantic",
    "matplotlib",
    "orchestrator.loop",
    "providers",
    "policies",
)


def test_importing_the_sdk_pulls_in_nothing_heavy() -> None:
    code = (
        "import sys\n"
        "import orchestrator.training\n"
        "from orchestrator.training import ResumableRun\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r} "
        f"or m in {FORBIDDEN!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True, text=True
    )
    assert out.stdout.strip() == "", f"orchestrator.training imported: {out.stdout.strip()}"
