"""What every run shares: atomic files, the run folder and its registry, heartbeats, the environment, the protocol."""
