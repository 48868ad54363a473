"""The peer server apps, each a script run in its own process (and, for mosec and TorchServe, in
its own virtualenv): they import only common.py beside them, never seqserve."""
