"""Heliotrope's orchestrator: the model, the tick loop and everything around it.

Read DESIGN in docs/design.md: signals -> snapshot -> policy -> planner -> executor ->
events, one `loop.Controller.tick` shared by replay, the live controller and Airflow.
"""

__version__ = "0.1.0"
