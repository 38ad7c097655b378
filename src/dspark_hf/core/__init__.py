"""Core: what `target.generate(assistant_model=drafter)` needs, and nothing else."""
