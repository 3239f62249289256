"""Schedules: the row codec, the schedule space, legality rules and the GPU targets."""
