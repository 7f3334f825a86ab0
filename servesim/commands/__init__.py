"""servesim.commands."""
