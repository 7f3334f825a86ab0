"""servesim.metrics."""
