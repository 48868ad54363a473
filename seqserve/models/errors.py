"""User-facing errors shared by every layer (torch-free, safe to import from `service`)."""


class UserError(Exception):
    """An error whose message is the whole story: the CLI prints it without a traceback."""


class DataError(UserError):
    """Bad user data: missing column, empty file, undecodable bytes, unknown dataset."""


class BundleError(UserError):
    """An artifact bundle that fails verification (hashes, manifest, parity)."""
