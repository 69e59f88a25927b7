"""The job as a program: its supervisor, gate, retries, journal and `trainctl job` commands."""
