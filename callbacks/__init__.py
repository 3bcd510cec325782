"""Lightning callbacks."""
