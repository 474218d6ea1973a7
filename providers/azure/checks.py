"""What `heliotrope providers check` asks Azure: credentials, the adapter's reads, prices, and
the caller's effective permissions against exactly the actions the adapter needs.

ARM has no dry run for creating a VM, but it tells a caller its own effective permissions at
a scope (`GET <scope>/providers/Microsoft.Authorization/permissions`, "Permissions - List
For Resource Group"; no permission needed), as role-like entries of `actions` and
`notActions` with wildcards. An action is granted when an entry's actions match it and none
of that entry's notActions do. The required sets below are those of infra/azure/role.json
and role-subscription.json (tests/providers/azure/test_azure_role.py keeps all three equal).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal

PERMISSIONS_API: Final = "2022-04-01"
GROUP_ACTIONS: Final = frozenset(
    {
        "Microsoft.Compute/disks/delete",
        "Microsoft.Compute/disks/write",
        "Microsoft.Compute/virtualMachines/delete",
        "Microsoft.Compute/virtualMachines/read",
        "Microsoft.Compute/virtualMachines/write",
        "Microsoft.Network/networkInterfaces/delete",
        "Microsoft.Network/networkInterfaces/join/action",
        "Microsoft.Network/networkInterfaces/write",
        "Microsoft.Network/virtualNetworks/subnets/join/action",
    }
)
SUBSCRIPTION_ACTIONS: Final = frozenset(
    {"Microsoft.Compute/locations/operations/read", "Microsoft.Compute/skus/read"}
)

Result = Literal["ok", "fail", "skip"]
CheckRow = tuple[str, Result, str]  # (check, result, reason), a row of `providers check`


def _matches(pattern: str, action: str) -> bool:
    return fnmatch.fnmatchcase(action.lower(), pattern.lower())


def granted(action: str, permissions: Iterable[Mapping[str, Any]]) -> bool:
    """Whether effective-permission entries grant `action`.

    >>> granted("Microsoft.Compute/disks/delete",
    ...         [{"actions": ["Microsoft.Compute/*"], "notActions": ["*/delete"]}])
    False
    """
    for entry in permissions:
        actions = entry.get("actions") or []
        not_actions = entry.get("notActions") or []
        if any(_matches(p, action) for p in actions) and not any(
            _matches(p, action) for p in not_actions
        ):
            return True
    return False


def missing(required: Iterable[str], permissions: Iterable[Mapping[str, Any]]) -> list[str]:
    entries = list(permissions)
    return sorted(a for a in required if not granted(a, entries))
