"""servesim.sweep."""
