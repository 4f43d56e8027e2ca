"""Calibration from traces: the cost model's efficiency factors fitted to what a run measured.

  fit          the event-level fit of named factors to an executed or simulated trace
  fit_events   how the cost model prices one trace event (the bridge from events to factors)
  fit_rule     the rule reward's per-sample factors
  synthetic    traces made from the cost model at known factors (the fit must recover them),
               and the shipped long-tailed workload

The stage-level fit needs the simulator and lives above it (`workflows.stagefit`).
Imports `placer.solve` (for the Plan) and below.
"""
