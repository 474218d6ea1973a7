"""The cloud registry (providers/registry.py): what each spec promises is true of the rest of
the system, the settings accept exactly the registered clouds, and Azure and Kubernetes go
through the same `providers check`, `offers` and clouds world as AWS and GCP (their suites'
fake Resource Manager and fake API servers on 127.0.0.1)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator import catalog
from orchestrator.cli import main
from orchestrator.clock import FakeClock
from orchestrator.errors import InputError
from orchestrator.live.clouds import (
    CloudSettings,
    check_providers,
    load_cloud_settings,
    make_providers,
    offers_table,
)
from orchestrator.live.world import LiveSettings, configured_world
from orchestrator.model import Location, Market
from orchestrator.training.notices import NOTICE_SOURCES, notice_source_from_env
from providers import registry
from providers.base import preemptible, priced, with_capacity
from providers.multi import MultiProvider
from tests.providers.conftest import (
    AWS_SPOT_L4,
    CLUSTER,
    CloudFakes,
    NewCloudFakes,
)

REPO = Path(__file__).resolve().parents[2]
T0 = datetime(2024, 5, 1, 17, 0, tzinfo=UTC)
AZURE_SPOT_A100 = "azure:eastus:Standard_NC24ads_A100_v4:spot"
K8S_H100_SPOT = "k8s:gpucloud:h100x8:spot"


# -- what each spec says ----------------------------------------------------------------------


def test_the_registry_lists_four_clouds_each_from_its_own_package() -> None:
    import importlib

    assert registry.names() == ("aws", "gcp", "azure", "k8s")
    assert [importlib.import_module(m).SPEC for m in registry.SPEC_MODULES] == list(
        registry.specs()
    )
    assert registry.SPEC_MODULES == (
        "providers.aws.spec",
        "providers.gcp.spec",
        "providers.azure.spec",
        "providers.kubernetes.spec",
    )
    with pytest.raises(Exception, match="oracle"):
        registry.spec("oracle")


@pytest.mark.parametrize("name", ["aws", "gcp", "azure", "k8s"])
def test_each_spec_names_real_infra_files_signal_sources_and_notice_readers(name: str) -> None:
    from orchestrator.signals.poll import SOURCE_NAMES

    spec = registry.spec(name)
    assert spec.infra and all((REPO / f).is_file() for f in spec.infra), spec.infra
    assert set(spec.signal_sources) <= set(SOURCE_NAMES)
    if spec.notice_source is not None:
        assert spec.notice_source in NOTICE_SOURCES
        source = notice_source_from_env({"HELIOTROPE_NOTICE_SOURCE": spec.notice_source})
        assert source is not None and source.name == spec.notice_source
    for region in spec.regions():
        assert catalog.region_info(name, region) is not None
    # Egress is priced for every cloud the registry offers, to every other one.
    for other in registry.specs():
        src = Location(name, spec.regions()[0] if spec.regions() else "ctx")
        dst = Location(other.name, other.regions()[0] if other.regions() else "ctx")
        assert catalog.egress_usd_per_gb(src, dst) >= 0
        assert catalog.bandwidth_gbps(src, dst) > 0


def test_the_signals_dag_cloud_families_are_the_registrys() -> None:
    from orchestrator.airflow_tasks import SIGNAL_FAMILIES, cloud_families

    clouds = {k: v for k, v in SIGNAL_FAMILIES.items() if k in registry.names()}
    assert clouds == cloud_families()
    assert set(cloud_families()) == {"aws", "gcp"}  # Azure and Kubernetes poll nothing yet


def test_the_dags_connections_are_the_registrys() -> None:
    from orchestrator.airflow_tasks import CONNECTION_IDS

    want = {s.name: s.connection_id for s in registry.specs() if s.connection_id}
    assert {k: v for k, v in CONNECTION_IDS.items() if k in registry.names()} == want
    assert set(want) == set(registry.names()) & {
        s.name for s in registry.specs() if s.signal_sources
    }


def test_signals_poll_the_catalog_regions_of_the_clouds_with_sources() -> None:
    from orchestrator.signals.poll import default_regions

    got = default_regions()
    assert {c for c, _ in got} == {"aws", "gcp"}
    assert ("aws", "us-east-1") in got and ("gcp", "europe-west4") in got
    assert len(got) == len(catalog.regions("aws")) + len(catalog.regions("gcp"))


def test_capabilities_are_read_not_probed() -> None:
    """An adapter is asked for an optional method only when it lists the capability: the
    simulated provider has none of them and is never asked."""
    from providers.sim import SimProvider

    sim = SimProvider.__new__(SimProvider)  # capabilities() reads no state
    assert priced(sim) is None and with_capacity(sim) is None and preemptible(sim) is None


def test_a_registered_clouds_geography_reaches_the_catalog() -> None:
    with pytest.raises(ValueError, match="already"):
        catalog.register_cloud(catalog.CloudGeography("aws", {}, 1.0))
    geo = catalog.CloudGeography(
        "testcloud",
        {"tc-east": catalog.RegionInfo("Nowhere", "DE", "eu")},
        1.3,
        lambda zone: zone[:-2] if zone.endswith(("-a", "-b")) else None,
    )
    catalog.register_cloud(geo)
    catalog.register_egress("testcloud", catalog.Egress(0.0, lambda *a: 0.03, lambda a: 0.07))
    assert catalog.grid_zone("testcloud", "tc-east-a") == "DE"
    assert catalog.pue("testcloud") == 1.3
    assert (
        catalog.egress_usd_per_gb(Location("testcloud", "tc-east"), Location("aws", "eu-west-1"))
        == 0.07
    )
    assert (
        catalog.egress_usd_per_gb(
            Location("testcloud", "tc-east"), Location("testcloud", "tc-west")
        )
        == 0.03
    )
    with pytest.raises(Exception, match="cloud"):
        catalog.egress_usd_per_gb(Location("nocloud", "x"), Location("aws", "us-east-1"))
    shapes = {"gpu_1x_h100": ("H100", 1), "gpu_8x_a100_80gb": ("A100-80GB", 8)}
    assert catalog.instance_gpus("testcloud", "gpu_1x_h100") is None
    catalog.register_instance_types("testcloud", shapes.get)
    assert catalog.instance_gpus("testcloud", "GPU_8x_A100_80GB") == ("A100-80GB", 8)
    with pytest.raises(ValueError, match="already"):
        catalog.register_instance_types("aws", shapes.get)
    assert catalog.instance_gpus("aws", "p5.48xlarge") == ("H100", 8)


# -- settings ---------------------------------------------------------------------------------


def _doc(**sections: Any) -> dict[str, Any]:
    return {"cluster": CLUSTER, "providers": list(sections), **sections}


def test_settings_accept_every_registered_cloud_and_name_the_field_otherwise(
    tmp_path: Path,
) -> None:
    settings = CloudSettings.model_validate(
        _doc(
            azure={"subscription_id": "s", "resource_group": "g", "regions": ["eastus"]},
            k8s={"contexts": [{"context": "onprem"}]},
        )
    )
    assert settings.providers == ["azure", "k8s"]
    assert settings.section("k8s").model_dump()["contexts"][0]["namespace"] == "heliotrope"

    path = tmp_path / "clouds.yaml"
    path.write_text(yaml.safe_dump(_doc(oracle={"regions": ["x"]})))
    with pytest.raises(InputError) as err:
        load_cloud_settings(path)
    assert "oracle" in str(err.value)

    path.write_text(yaml.safe_dump({"cluster": CLUSTER, "providers": ["oracle"]}))
    with pytest.raises(InputError, match=r"not a registered cloud.*aws, gcp, azure, k8s"):
        load_cloud_settings(path)

    path.write_text(yaml.safe_dump(_doc(k8s={"contexts": [{"context": "c", "pue": 0.5}]})))
    with pytest.raises(InputError) as err:
        load_cloud_settings(path)
    assert "k8s.contexts.0.pue" in str(err.value)

    path.write_text(
        yaml.safe_dump(
            {
                **_doc(k8s={"contexts": [{"context": "c"}]}),
                "checkpoints": {"oracle:x": "file:///tmp"},
            }
        )
    )
    with pytest.raises(InputError, match="checkpoints"):
        load_cloud_settings(path)


# -- Azure and Kubernetes through the registry --------------------------------------------------


def _settings(new: NewCloudFakes, tmp: Path, *clouds: str, **extra: Any) -> CloudSettings:
    sections = {"azure": new.azure_section, "k8s": new.k8s_section}
    doc = _doc(**{c: sections[c]() for c in clouds})
    doc["checkpoints"] = {"default": f"file://{tmp}/checkpoints/{{cloud}}/{{region}}"}
    doc.update(extra)
    return CloudSettings.model_validate(doc)


def test_providers_check_for_azure_and_kubernetes(
    new_cloud_fakes: NewCloudFakes, tmp_path: Path
) -> None:
    settings = _settings(new_cloud_fakes, tmp_path, "azure", "k8s")
    rows = check_providers(settings, clock=FakeClock(T0), access=new_cloud_fakes.access())
    got = {(r.provider, r.check): r.result for r in rows}
    assert got[("azure", "credentials")] == "ok"
    assert got[("azure", "Microsoft.Compute/skus/read")] == "ok"
    assert got[("azure", "permissions in resource group heliotrope-ml")] == "ok"
    assert got[("azure", "retail prices")] == "ok"
    assert got[("k8s", "onprem: nodes")] == "ok" and got[("k8s", "onprem: rbac")] == "ok"
    assert got[("k8s", "gpucloud: rbac")] == "ok"
    assert all(r.result != "fail" for r in rows), [r for r in rows if r.result == "fail"]
    assert "fake-arm-token" not in json.dumps([r.row() for r in rows])

    # RBAC refusing a verb in one cluster fails that row only, naming the file to apply.
    new_cloud_fakes.kube["gpucloud"].denied.add(("pods", "delete"))
    rows = check_providers(
        settings, clouds=["k8s"], clock=FakeClock(T0), access=new_cloud_fakes.access()
    )
    [bad] = [r for r in rows if r.result == "fail"]
    assert bad.check == "gpucloud: rbac" and "infra/k8s/rbac.yaml" in bad.reason


def test_a_cloud_whose_settings_are_wrong_gets_one_failed_row_the_others_are_checked(
    new_cloud_fakes: NewCloudFakes, tmp_path: Path
) -> None:
    settings = _settings(new_cloud_fakes, tmp_path, "azure", "k8s")
    bad = settings.model_copy(
        update={"k8s": settings.section("k8s").model_copy(update={"contexts": []})}
    )
    rows = check_providers(bad, clock=FakeClock(T0), access=new_cloud_fakes.access())
    k8s = [r for r in rows if r.provider == "k8s"]
    assert [(r.check, r.result) for r in k8s] == [("settings", "fail")]
    assert "regions" in k8s[0].reason
    assert any(r.provider == "azure" and r.result == "ok" for r in rows)


def test_offers_for_azure_and_kubernetes(new_cloud_fakes: NewCloudFakes, tmp_path: Path) -> None:
    settings = _settings(new_cloud_fakes, tmp_path, "azure", "k8s")
    rows, unpriced = offers_table(
        settings, market=Market.SPOT, clock=FakeClock(T0), access=new_cloud_fakes.access()
    )
    by_id = {f"{r['cloud']}:{r['zone']}:{r['instance_type']}:{r['market']}": r for r in rows}
    a100 = by_id[AZURE_SPOT_A100]
    assert a100["price_source"] == "azure-retail-prices" and a100["usd_per_hour"] == 0.7346
    assert a100["grid_zone"] == "US-MIDA-PJM"
    h100 = by_id[K8S_H100_SPOT]
    assert h100["price_source"] == "k8s-config" and h100["usd_per_gpu_hour"] == 1.25
    assert h100["grid_zone"] == "US-MIDA-PJM"
    assert [r["usd_per_gpu_hour"] for r in rows] == sorted(r["usd_per_gpu_hour"] for r in rows)
    assert {r["market"] for r in rows} == {"spot"}
    assert unpriced >= 1  # the H100 spot sizes Retail Prices has no spot meter for


def test_heliotrope_offers_and_providers_check_for_kubernetes_through_the_cli(
    new_cloud_fakes: NewCloudFakes,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Kubernetes needs nothing but its kubeconfig: the CLI reaches the fakes as it is."""
    monkeypatch.setenv("HELIOTROPE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HELIOTROPE_DB_URL", raising=False)
    path = tmp_path / "clouds.yaml"
    path.write_text(yaml.safe_dump(_doc(k8s=new_cloud_fakes.k8s_section())))

    assert main(["providers", "check", "--config", str(path), "--json"]) == 0
    out = capsys.readouterr()
    assert "fake-kube-token" not in out.out + out.err
    checks = json.loads(out.out)
    assert {(r["check"], r["result"]) for r in checks} >= {
        ("onprem: rbac", "ok"),
        ("gpucloud: nodes", "ok"),
    }

    # On-premises A100s at the configured 1.10 $/GPU-h (the L4 node is not ready: none).
    assert main(["offers", "--config", str(path), "--gpu", "A100", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [
        (r["cloud"], r["region"], r["instance_type"], r["usd_per_gpu_hour"], r["price_source"])
        for r in rows
    ] == [("k8s", "onprem", f"a100-80gbx{n}", 1.1, "k8s-config") for n in (1, 2, 4, 8)]
    assert main(["offers", "--config", str(path), "--gpu", "L4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_a_clouds_world_of_aws_and_azure_builds(
    cloud_fakes: CloudFakes, new_cloud_fakes: NewCloudFakes, tmp_path: Path
) -> None:
    clock = FakeClock(datetime.now(UTC))
    doc = cloud_fakes.settings_doc(providers=["aws", "azure"])
    del doc["gcp"]
    doc["azure"] = new_cloud_fakes.azure_section()
    live = LiveSettings(
        world="clouds", cluster=doc.pop("cluster"), policy=doc.pop("policy"), clouds=doc
    )
    access = new_cloud_fakes.access(cloud_fakes.access(sleep=clock.sleep))
    world = configured_world(live, clock=clock, access=access)
    ids = {o.id for o in world.offers}
    assert AWS_SPOT_L4 in ids and AZURE_SPOT_A100 in ids
    assert {o.cloud for o in world.offers} == {"aws", "azure"}
    assert isinstance(world.provider, MultiProvider)
    assert set(world.provider.providers) == {"aws", "azure"}
    quotes = world.extra["quotes"]
    assert quotes[AZURE_SPOT_A100].source == "azure-retail-prices"
    assert world.store_uri(next(o for o in world.offers if o.id == AZURE_SPOT_A100)).endswith(
        "/checkpoints/azure/eastus"
    )


def test_the_multi_provider_reads_kubernetes_capacity_by_capability(
    new_cloud_fakes: NewCloudFakes, tmp_path: Path
) -> None:
    settings = _settings(new_cloud_fakes, tmp_path, "azure", "k8s")
    providers = make_providers(settings, clock=FakeClock(T0), access=new_cloud_fakes.access())
    assert with_capacity(providers["azure"]) is None
    assert with_capacity(providers["k8s"]) is not None
    multi = MultiProvider(list(providers.values()))
    multi.offers()
    capacity = multi.capacity()
    assert capacity[K8S_H100_SPOT] == 2  # two spot H100 nodes of 8, nothing of ours on them
    assert not any(k.startswith("azure:") for k in capacity)


class _RefusedCredential:
    """A credential whose refusal quotes the secret it was given (as a careless identity
    provider might): `providers check` must not print it."""

    def __init__(self, secret: str) -> None:
        self.secret = secret

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.core.exceptions import ClientAuthenticationError

        raise ClientAuthenticationError(message=f"AADSTS7000215: invalid secret {self.secret}")


def test_providers_check_never_prints_an_azure_secret(
    new_cloud_fakes: NewCloudFakes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from providers.azure.spec import AzureAccess

    secret = "hElIo~tRoPe.AzUrE_sEcReT-0123456789"
    monkeypatch.setenv("AZURE_CLIENT_SECRET", secret)
    settings = _settings(new_cloud_fakes, tmp_path, "azure")
    access = registry.CloudAccess(
        {
            "azure": AzureAccess(
                credential=_RefusedCredential(secret), transport=new_cloud_fakes.arm.transport()
            )
        }
    )
    rows = check_providers(settings, clock=FakeClock(T0), access=access)
    assert [(r.check, r.result) for r in rows] == [("credentials", "fail"), ("compute", "skip")]
    assert "refused" in rows[0].reason
    assert secret not in json.dumps([r.row() for r in rows])
    assert new_cloud_fakes.arm.calls == []  # nothing was asked of ARM without a token


def test_loading_the_registry_imports_no_cloud_sdk_and_no_torch() -> None:
    """Every `heliotrope` command that reads clouds settings loads all specs: they must stay
    light (SDKs inside `build`/`check`; the training SDK's package imports torch)."""
    import subprocess
    import sys

    code = (
        "import sys; from providers import registry; registry.specs(); "
        "import orchestrator.live.clouds; "
        "print(sorted({m.split('.')[0] for m in sys.modules}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        cwd=REPO,
    )
    loaded = set(json.loads(done.stdout.strip().replace("'", '"')))
    assert not loaded & {"boto3", "botocore", "google", "azure", "kubernetes", "torch"}
