"""servesim.workload."""
