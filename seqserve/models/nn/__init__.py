"""PyTorch modules: the recurrent layers, attention, decoders and the task models (torch)."""
