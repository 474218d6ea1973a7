"""Compute providers: adapters that launch, list and terminate GPU instances.

`base.py` is the contract; `sim.py` the trace-driven provider replay and tests use;
`aws/`, `gcp/`, `local/` the real adapters. Cloud SDKs are imported lazily inside them.
Providers never import policies.
"""
