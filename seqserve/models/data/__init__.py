"""Datasets: built-in generators (langid, numbers-en-fr, numbers-en-de) and user-data readers.

Torch-free. Import the registry for the public API::

    from seqserve.models.data.registry import load_dataset, generate, write_dataset
"""
