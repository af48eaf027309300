"""What both Mistral tool-call syntaxes share: the control tokens that mark a call, and call ids as Mistral's
templates want them (9 alphanumerics).

The markers are control tokens, which decoding normally drops: a request that parses Mistral calls keeps them in
its text (registry.shown_tokens), as llama.cpp keeps its "preserved tokens".
"""

from __future__ import annotations

import hashlib
import secrets
import string
from collections.abc import Callable

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
MARKERS = (TOOL_CALLS, ARGS, CALL_ID)
_ALNUM = string.ascii_letters + string.digits
ID_LEN = 9  # Mistral's templates refuse other call ids ("alphanumeric strings with length 9")


def new_mistral_id() -> str:
    return "".join(secrets.choice(_ALNUM) for _ in range(ID_LEN))


def mistral_id(call_id: str) -> str:
    """A call id as Mistral's templates accept it: kept when it is 9 alphanumerics, else a stable 9-character digest
    (the same for the assistant's call and the tool message that answers it)."""
    if len(call_id) == ID_LEN and all(c in _ALNUM for c in call_id):
        return call_id
    n = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    out = []
    for _ in range(ID_LEN):
        n, d = divmod(n, len(_ALNUM))
        out.append(_ALNUM[d])
    return "".join(out)


def marker_ids(token_id_of: Callable[[str], int | None]) -> dict[str, int]:
    """The Mistral markers this vocabulary has as single tokens."""
    out = {}
    for m in MARKERS:
        i = token_id_of(m)
        if i is not None:
            out[m] = int(i)
    return out
