"""servesim.plots."""
