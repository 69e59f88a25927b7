"""The folder rank-exec puts first on a rank's PYTHONPATH for `trainctl.autostep` (only its
`sitecustomize` module is meant to be found there)."""
