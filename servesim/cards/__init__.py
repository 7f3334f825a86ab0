"""servesim.cards."""
