"""Offline replay: run policies through the real tick loop on recorded or generated traces.

`runner.py` drives `Controller.tick` with a fake clock and the simulated provider;
`metrics.py` turns fleets and events into results, a timeline and cumulative series;
`report.py` writes the plots and the HTML report.
"""
