"""servesim.analysis."""
