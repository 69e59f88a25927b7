"""Helpers shared by tests: staging real recorded outputs as a node's commands."""
