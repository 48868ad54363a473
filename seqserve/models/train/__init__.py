"""Training: one fit loop for every task, its batches, evaluation, metrics and plots (torch)."""
