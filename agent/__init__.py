"""emmy-agent: explore the schedules of emmy's kernels with an LLM or a built-in search."""
