"""Run a plan on Ray: placement groups, role actors, the RL loop, sandboxed environments."""
