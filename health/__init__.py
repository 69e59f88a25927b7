"""Node health: collect, parse, check, verdict."""
