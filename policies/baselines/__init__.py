"""Baseline policies: what users run today, one module each, each citing its source.

All are frozen dataclasses whose fields are their options; `name` is a class attribute.
"""

from policies.baselines.carbon_greedy import CarbonGreedy
from policies.baselines.curtailment_threshold import CurtailmentThreshold
from policies.baselines.on_demand import OnDemand
from policies.baselines.spot_failover import SpotFailover
from policies.baselines.uniform_progress import UniformProgress

__all__ = ["CarbonGreedy", "CurtailmentThreshold", "OnDemand", "SpotFailover", "UniformProgress"]
