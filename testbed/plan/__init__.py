"""Replay plans: a schedule lowered to what each rank replays (lanes, calls, ring steps)."""
