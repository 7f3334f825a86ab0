"""servesim.speculation."""
