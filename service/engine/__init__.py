"""Translator decoding: per-request search state (`search`), the step loop (`engine`), and the
glue that serves a translator bundle through them (`worker`)."""
