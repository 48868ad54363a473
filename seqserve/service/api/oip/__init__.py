"""Open Inference Protocol (KServe v2) REST: `routes` (health, metadata, infer), `codec` (JSON
and binary tensor data), `schemas`, `tasks` (each task's tensors <-> its worker's methods)."""
