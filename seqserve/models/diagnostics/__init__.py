"""Diagnostics: gradient flow per cell and scores per surface form (torch)."""
