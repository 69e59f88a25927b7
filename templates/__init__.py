"""Jinja templates for sbatch scripts (package data)."""
