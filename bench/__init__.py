"""Benchmarks that print tables (solve time and gap, simulator events/s, executor overhead)."""
