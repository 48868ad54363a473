"""Tokenizers, normalization and word alignment: torch-free, the server imports them."""
