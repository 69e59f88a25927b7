"""Fabric test: pairwise all_reduce bandwidth across nodes, and who to blame when it is slow."""
