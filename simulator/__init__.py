"""Discrete-event simulation (simpy) of RL iterations under a plan.

Entry point: `simulator.api.simulate_plan(plan, iterations, seed, config, ...) -> SimResult`
(`.metrics`, `.trace`); `simulator.steady.simulate_steady(plan, seed, ...)` simulates until the
steady-state iteration time is known within a confidence interval (what the CLI reports).
One concept per module: config (variance knobs), workload (per-sample lengths and tool
latencies), engine (continuous-batching rollout replicas, compressed decode runs), environment
(CPU pools), network (weight sync over shared links), training (frozen and training stages),
iteration (sync / async pipelines on slots), faults (stragglers, failures and checkpoints),
metrics, steady (steady-state window and interval), recorder (trace rows, kept in columns),
plots, golden (regression files), handplans (plans for examples and benchmarks).
A fleet of jobs: fleet (`simulate_fleet`: every job's iterations on one clock, with shared CPU
pools, links and storage, and preemptions), fabric (links shared over time), fleetresult,
fleetplots (the fleet's Gantt chart and quota use).
"""
