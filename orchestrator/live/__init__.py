"""The live control plane: the tick loop over a state store, real providers and real jobs.

`controller.LiveController` runs `loop.Controller.tick` on the wall clock (or scenario time
at a speed-up), persists every tick's events and per-job rows with a version check, and
hands moves that need a checkpoint copied to `driver.MigrationDriver`, which drives the
migration state machine (`orchestrator.migration`) one step per tick.
"""
