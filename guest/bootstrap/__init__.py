"""The folder rank-exec puts first on a watched rank's PYTHONPATH: only `sitecustomize` is meant to be found here."""
