"""`check_permissions`: what `heliotrope providers check` reports per kubeconfig context."""

from __future__ import annotations

from providers.kubernetes import KubeRegion
from tests.providers.kubernetes.fake_kube import FakeKube
from tests.providers.kubernetes.support import GPUCLOUD, ONPREM, Factory


def test_every_verb_allowed_is_ok_and_nothing_changes(
    make_provider: Factory, kube: dict[str, FakeKube]
) -> None:
    rows = {
        check: (result, reason) for check, result, reason in make_provider().check_permissions()
    }
    assert {k: v[0] for k, v in rows.items()} == {
        "onprem: nodes": "ok",
        "onprem: rbac": "ok",
        "gpucloud: nodes": "ok",
        "gpucloud: rbac": "ok",
    }
    assert rows["onprem: nodes"][1] == "1 GPU pool(s), 16 free GPU(s)"
    assert rows["gpucloud: rbac"][1].startswith("all 9 verbs")
    reviews = kube["onprem"].requests_for("selfsubjectaccessreviews", "create")
    asked = {
        (
            r.body["spec"]["resourceAttributes"]["resource"],
            r.body["spec"]["resourceAttributes"]["verb"],
            r.body["spec"]["resourceAttributes"].get("namespace"),
        )
        for r in reviews
    }
    assert ("nodes", "list", None) in asked and ("pods", "delete", "heliotrope") in asked
    assert all(not f.pods and not f.services for f in kube.values())


def test_a_denied_verb_is_named(make_provider: Factory, onprem: FakeKube) -> None:
    onprem.denied = {("pods", "delete"), ("nodes", "list")}
    rows = {
        check: (result, reason) for check, result, reason in make_provider().check_permissions()
    }
    assert rows["onprem: rbac"] == (
        "fail",
        "not allowed: nodes list, pods delete (apply infra/k8s/rbac.yaml in namespace heliotrope)",
    )
    assert rows["gpucloud: rbac"][0] == "ok"


def test_a_wrong_token_or_a_missing_context_fails_that_context_only(
    make_provider: Factory, onprem: FakeKube
) -> None:
    onprem.token = "rotated"
    regions = (ONPREM, GPUCLOUD, KubeRegion("nowhere"))
    rows = {
        check: (result, reason)
        for check, result, reason in make_provider(regions=regions).check_permissions()
    }
    assert rows["onprem: nodes"][0] == "fail" and "401" in rows["onprem: nodes"][1]
    assert rows["onprem: rbac"][0] == "skip"
    assert rows["gpucloud: rbac"][0] == "ok"
    assert rows["nowhere: nodes"][0] == "fail" and "nowhere" in rows["nowhere: nodes"][1]
