"""servesim.config."""
