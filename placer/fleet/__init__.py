"""Many jobs on one cluster under team quotas.

`spec` reads a fleet file (jobs, teams with Kueue-style quotas and cohorts, one cluster);
`alloc` is the second-level CP-SAT model that gives each job whole nodes of each pool, with each
job's iteration time evaluated lazily by `inner` (the job-level planner on the job's share);
`planner.plan_fleet` runs it and `result` reports it. `sharing` (CPU environment pools) and
`rolloutpool` (inference engines time-shared by jobs of one model) are what jobs may share,
declared or chosen by the allocation; `sharedplan` prices the shared flavours. The package sits
above `placer.solve` (the job-level planner is its inner problem) and below the simulator, which
a fleet's contention simulation would use.
"""
