"""The cloud world: the registered clouds' providers (providers/registry.py: AWS, GCP, Azure,
Kubernetes) behind one `MultiProvider`, per-region checkpoint stores, and the checks and
tables the CLI prints.

Cloud settings are the `clouds:` section of `$HELIOTROPE_HOME/config.yaml`, or a YAML file
of their own (`clouds_file:`, `heliotrope providers check --config`, default
`$HELIOTROPE_HOME/clouds.yaml`); every field is described in docs/providers.md:

    cluster: ml-prod
    providers: [aws, gcp]
    aws:
      regions: [us-east-1, us-west-2]
    gcp:
      project: my-gpu-project
      zones: [us-central1-a, europe-west4-a]
      billing_api_key_env: HELIOTROPE_GCP_BILLING_KEY   # the variable's name, never the key
    checkpoints:
      aws:us-east-1: s3://heliotrope-ml-prod-use1/ckpt
      default: gs://heliotrope-ml-prod-{region}/ckpt     # {cloud} {region} {cluster}

Each registered cloud has a section of its own name, validated by its spec's settings model;
nothing here knows a cloud by name. Credentials are never part of the file: each adapter
uses its cloud's standard chain (boto3's, Application Default Credentials,
DefaultAzureCredential, the kubeconfig), or what the caller passes in `CloudAccess`.

One module per job, each going through the registry's hook for its step:

- `settings`: `CloudSettings` (one section per registered cloud, `CloudSpec.settings_model`),
  `load_cloud_settings`, `parse_clouds`;
- `adapters`: `make_providers`, each cloud's adapter by `CloudSpec.build`;
- `world`: `clouds_world`, the live world of these clouds (offers, quotes as the price
  prior, per-region checkpoint stores);
- `carbon`: `CarbonIndex`, the grid carbon `heliotrope offers` shows;
- `offers`: `offers_table`, `heliotrope offers`;
- `checks`: `check_providers`, `heliotrope providers check` (`CloudSpec.check`), redacted.

This package re-exports their public names.
"""

from __future__ import annotations

from orchestrator.live.clouds.adapters import build_context, make_providers
from orchestrator.live.clouds.carbon import CarbonIndex, CarbonReading, carbon_sources
from orchestrator.live.clouds.checks import CheckResult, check_providers, check_redactor
from orchestrator.live.clouds.offers import (
    compact_offer_rows,
    gpu_matches,
    offer_rows,
    offers_table,
    parse_market,
)
from orchestrator.live.clouds.settings import (
    CloudSettings,
    load_cloud_settings,
    parse_clouds,
    settings_path,
)
from orchestrator.live.clouds.world import clouds_world
from providers.registry import CloudAccess

__all__ = [
    "CarbonIndex",
    "CarbonReading",
    "CheckResult",
    "CloudAccess",
    "CloudSettings",
    "build_context",
    "carbon_sources",
    "check_providers",
    "check_redactor",
    "clouds_world",
    "compact_offer_rows",
    "gpu_matches",
    "load_cloud_settings",
    "make_providers",
    "offer_rows",
    "offers_table",
    "parse_clouds",
    "parse_market",
    "settings_path",
]
