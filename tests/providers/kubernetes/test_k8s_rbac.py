"""infra/k8s/rbac.yaml grants exactly the verbs the adapter uses, at the scope it uses them.

Every request the adapter sent to the fake API servers in this session (the Kubernetes tests
before this file, alphabetically, and this file's own tour) is mapped to its RBAC
(resource, verb) and scope: namespaced requests must be allowed by the Role, cluster-wide ones
(nodes) by the ClusterRole, and neither may allow more.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from providers.kubernetes.provider import CLUSTER_VERBS, NAMESPACED_VERBS
from tests.providers.kubernetes.fake_kube import ALL_CALLS, Call, FakeKube
from tests.providers.kubernetes.support import (
    A100X1,
    CLUSTER,
    NAMESPACE,
    Factory,
    spec,
)

RBAC = Path(__file__).resolve().parents[3] / "infra" / "k8s" / "rbac.yaml"


def documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(RBAC.read_text()) if d]


def granted(kind: str) -> set[tuple[str, str]]:
    [role] = [d for d in documents() if d["kind"] == kind]
    pairs: set[tuple[str, str]] = set()
    for rule in role["rules"]:
        assert rule["apiGroups"] == [""], "the adapter uses the core API group only"
        assert "*" not in rule["resources"] and "*" not in rule["verbs"], "no wildcards"
        assert rule["verbs"] == sorted(rule["verbs"]), "keep verbs sorted"
        pairs |= {(r, v) for r in rule["resources"] for v in rule["verbs"]}
    return pairs


def needed(calls: list[Call]) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    # SelfSubjectAccessReviews (providers check asking what it may do) are allowed to every
    # authenticated user by the built-in system:basic-user ClusterRole.
    calls = [c for c in calls if c.resource != "selfsubjectaccessreviews"]
    namespaced = {(c.resource, c.verb) for c in calls if c.namespaced}
    cluster = {(c.resource, c.verb) for c in calls if not c.namespaced}
    return namespaced, cluster


def test_bindings_name_the_roles_and_the_namespace() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in documents()}
    assert set(docs) == {
        ("ServiceAccount", "heliotrope"),
        ("Role", "heliotrope"),
        ("RoleBinding", "heliotrope"),
        ("ClusterRole", "heliotrope-nodes"),
        ("ClusterRoleBinding", "heliotrope-nodes"),
    }
    assert docs[("Role", "heliotrope")]["metadata"]["namespace"] == NAMESPACE
    assert docs[("RoleBinding", "heliotrope")]["roleRef"]["name"] == "heliotrope"
    assert docs[("ClusterRoleBinding", "heliotrope-nodes")]["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "heliotrope-nodes",
    }


def test_rbac_grants_exactly_what_the_adapter_calls(
    make_provider: Factory, kube: dict[str, FakeKube], onprem: FakeKube
) -> None:
    provider = make_provider()  # a tour of every operation, so this test stands alone too
    provider.offers()
    gang = provider.launch(spec(A100X1, count=2), request_id="tour").instance_id or ""
    solo = provider.launch(spec(), request_id="tour-solo").instance_id or ""
    provider.list_instances(cluster=CLUSTER)
    onprem.disrupt(f"{gang.split('/')[1]}-0")
    provider.poll_events()
    provider.terminate([gang, solo], request_id="stop")
    tour = needed([c for fake in kube.values() for c in fake.calls])

    everything = needed(ALL_CALLS)
    have = (granted("Role"), granted("ClusterRole"))
    assert tour == everything == have, (
        f"namespaced: needed {sorted(everything[0])}, granted {sorted(have[0])}; "
        f"cluster-wide: needed {sorted(everything[1])}, granted {sorted(have[1])}"
    )


def test_the_checks_ask_for_exactly_the_rbac_verbs() -> None:
    assert granted("Role") == NAMESPACED_VERBS
    assert granted("ClusterRole") == CLUSTER_VERBS
