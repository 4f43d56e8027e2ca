"""The job and cluster specification: what a user writes, read and checked.

  job          `Job`: the whole job model (algorithm, models, batch, lengths, environment,
               pipeline, tail policy, cluster, pins); the roles it runs
  load         reading a job file (YAML or JSON), the checks across sections, writing one back
  sections     the job's workload sections (algorithm, models, batch, lengths, environment,
               pipeline, tail policy, precision)
  hardware     device types, pools, topology and the cluster
  arch         `ModelArch`: a model's shape and its parameter, KV-cache and state counts
  catalog      the shipped device and model catalogs plus a job's own entries; `resolve(job)`
  names        model and device names as people write them: variants, matching, suggestions
  pins         layout pins a job fixes for a role
  distributions, sampling   length and latency distributions and seeded draws from them
  localdata    local checkpoints and prompt datasets a job names
  current      the placement a job runs today (recorded by `placer import`)
  base, errorlines          the strict base model and bounded numbers; validation errors as lines

Imports only `placer.base` and `traces` (a job may replay a workload trace).
"""
