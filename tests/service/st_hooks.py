"""Schemathesis hooks of tests/service/test_openapi.py (loaded by `st run` through
SCHEMATHESIS_HOOKS): generated bodies that carry a state token (`state`) or ask for one
(`return_state: true`) are left out. A state token is an HMAC-signed value that no schema can
describe (any string is schema-valid, only the server's own tokens verify), and the fuzzed
server has no state secret; tests/service/api/test_lm_state.py and test_series_state.py test
those fields (tampered, foreign, missing secret, continuation)."""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.hook
def filter_body(ctx: Any, body: Any) -> bool:
    if not isinstance(body, dict):
        return True
    params = body.get("parameters")
    asks = isinstance(params, dict) and params.get("return_state") not in (None, False)
    inputs = body.get("inputs")
    carries = isinstance(inputs, list) and any(
        isinstance(i, dict) and i.get("name") == "state" for i in inputs)
    return not ("state" in body or body.get("return_state") not in (None, False)
                or asks or carries)
