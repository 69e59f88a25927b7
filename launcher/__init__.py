"""Job planning, sbatch rendering and submission."""
