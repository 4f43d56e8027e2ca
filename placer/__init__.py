"""placer: plan, simulate and execute RL post-training placements across GPU, CPU and LPU pools."""
__version__ = "0.1.0"
