"""Sample site configurations shipped with trainctl (package data)."""
