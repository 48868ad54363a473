"""Peers benchmark: the same classifier bundle served by seqserve, mosec, TorchServe and a
per-request FastAPI server, one after another under the same load (see run.py)."""
