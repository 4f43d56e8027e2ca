"""The solver: from a job's cost table to a `Plan`.

  candidates, tablework   every memory-feasible, parallelism-valid config of each role, priced
  ilp, ilp_bound, ilp_solve   the placement ILP (CP-SAT), its bounds and its solve drivers
  assemble, mapping       a Plan from chosen candidates; slots mapped onto nodes and devices
  planner                 job -> cost table -> ILP -> Plan; `diagnose` when nothing fits
  baselines, current      how placements are chosen today, priced on the same table
  explain, moves, render, pricing, hostmem   why a plan looks as it does, what moved between two
                          plans, tables, USD, host memory and checkpoints of a plan
  planfile                the Plan document that simulate, execute and the notebooks read

Imports `placer.cost` and below.
"""
