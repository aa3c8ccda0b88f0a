"""verl entry point (group ``verl.plugins``): filled in by the verl adapter."""
