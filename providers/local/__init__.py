"""The local provider: GPU "instances" are subprocesses on this machine.

"Regions" are directories under a root (default `~/.heliotrope/local/<region>/`), each with
a checkpoint store (`LocalProvider.checkpoint_uri`) and one directory per instance holding
its metadata, log, progress, exit status and preemption notice. Launch, list and terminate
survive a controller restart (the state is on disk, processes are identified by pid and
start time); `preempt` simulates a spot reclaim with a notice file the job can watch.
`local_offers` builds the offers a scenario prices. Standard library only; Linux (/proc).
"""

from providers.local.offers import LOCAL_CLOUD, LOCAL_INSTANCE_TYPE, local_offers
from providers.local.provider import DEFAULT_ROOT, LocalProvider, instance_id_for

__all__ = [
    "DEFAULT_ROOT",
    "LOCAL_CLOUD",
    "LOCAL_INSTANCE_TYPE",
    "LocalProvider",
    "instance_id_for",
    "local_offers",
]
