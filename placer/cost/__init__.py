"""The cost model: the memory and time of every role's work on a device type and layout.

Bottom up: `efficiency` (the fitted factors), `collectives` (alpha-beta), `sharding` (how a
layout splits a model), `roofline` (bytes and rates), `layercomm` (a layout's collectives),
`generation` (prefill and decode steps), `model` (training, scoring, transfers), `admission`
and `batching` (one engine replica's scheduling), `tail_samples`, `rollout_tail` and `toolqueue`
(tail-aware rollout time), `rulecheck` (rule rewards), `estimate` (one role's work per
iteration), `split` (a role over several pools), `timing` (how roles combine into one step),
`calibration` (profiles that override the factors).

Imports only `placer.spec` and below. The solver, the baselines and the simulator all price
through it, so their numbers agree on the same work.
"""
