"""Recovery: restoring the newest good step, and relaunching failed jobs."""
