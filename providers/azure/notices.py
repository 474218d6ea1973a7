"""Spot eviction notices inside an Azure VM: Scheduled Events from the instance metadata
service (IMDS), read by the training SDK (`orchestrator.training.notices`, where the reader
lives: a training script imports no provider).

`GET http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01` with header
`Metadata: true` answers

    {"DocumentIncarnation": 3,
     "Events": [{"EventId": "...", "EventType": "Preempt", "ResourceType": "VirtualMachine",
                 "Resources": ["hel-0123abcd"], "EventStatus": "Scheduled",
                 "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT", "EventSource": "Platform",
                 "DurationInSeconds": -1, "Description": "..."}]}

A Spot eviction is `EventType: Preempt` with at least 30 seconds' notice; `Terminate`
(the VM is being deleted) is a notice too. Only events naming this VM count. The adapter
sets `HELIOTROPE_NOTICE_SOURCE=azure` on Spot VMs, which makes the SDK's
`notice_source_from_env` run `AzureScheduledEvents`.
"""

from __future__ import annotations

from typing import Final

from orchestrator.training.notices import (
    AZURE_INSTANCE_API as INSTANCE_API,
)
from orchestrator.training.notices import (
    AZURE_METADATA_URL as IMDS_URL,
)
from orchestrator.training.notices import (
    AZURE_NOTICE_EVENT_TYPES as NOTICE_EVENT_TYPES,
)
from orchestrator.training.notices import (
    AZURE_SCHEDULED_EVENTS_API as SCHEDULED_EVENTS_API,
)
from orchestrator.training.notices import (
    AzureScheduledEvents,
)
from orchestrator.training.notices import (
    azure_preemption_notice as preemption_notice,
)

NOTICE_SOURCE: Final = AzureScheduledEvents.name  # HELIOTROPE_NOTICE_SOURCE on spot VMs

__all__ = [
    "IMDS_URL",
    "INSTANCE_API",
    "NOTICE_EVENT_TYPES",
    "NOTICE_SOURCE",
    "SCHEDULED_EVENTS_API",
    "AzureScheduledEvents",
    "preemption_notice",
]
