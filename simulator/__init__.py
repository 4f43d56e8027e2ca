"""Discrete-event simulation (simpy) of RL iterations under a plan."""
