"""GPU kernels, below the runtime: the runtime calls each family through its entry point only."""
