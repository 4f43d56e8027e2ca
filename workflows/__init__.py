"""Workflows across the three parts: they plan (`placer`), simulate (`simulator`) and execute
(`executors`), so they live beside those packages rather than in `placer`, which imports neither
(DESIGN.md, "Dependencies point one way").

  demo              `make demo`: plan -> simulate -> execute -> calibrate -> fidelity on a job
  fidelity          a run's measured times against the calibrated simulation of its own inputs
  fidelity_heldout  calibrate on one run, predict runs with another batch, length or placement
  whatif            sweeps that re-plan and simulate one changed thing at a time
  operators         operator-level fidelity: single measured kernels priced by the cost model's
                    own pieces (opdata: the points; opfit: the refit of their factors)
"""
