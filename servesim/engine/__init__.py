"""servesim.engine."""
