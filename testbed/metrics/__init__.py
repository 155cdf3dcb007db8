"""What a run measured (iteration time, exposed switching, windows) and whether to trust it."""
