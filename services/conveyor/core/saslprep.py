"""SASLprep (RFC 4013) as PostgreSQL applies it to a SCRAM password (``src/common/saslprep.c``):
libpq and asyncpg prepare the password a client sends this way, so a verifier that
``conveyor migrate --create-roles`` computes must be of the prepared password too, or a role
whose password holds, say, a non-ASCII space or a ligature could never log in.

PostgreSQL's rules: an ASCII password is used as is; otherwise map (non-ASCII spaces to a space,
"commonly mapped to nothing" characters removed), normalize to NFKC, and use the result unless
it is empty, holds a prohibited or unassigned character, or breaks the bidirectional rules, in
which case the original password is used unchanged."""

from __future__ import annotations

import stringprep
import unicodedata

_PROHIBITED = (
    stringprep.in_table_a1,  # unassigned code points: PostgreSQL prohibits them (stored strings)
    stringprep.in_table_c12,
    stringprep.in_table_c21_c22,
    stringprep.in_table_c3,
    stringprep.in_table_c4,
    stringprep.in_table_c5,
    stringprep.in_table_c6,
    stringprep.in_table_c7,
    stringprep.in_table_c8,
    stringprep.in_table_c9,
)


def saslprep(password: str) -> str:
    """The password PostgreSQL's SCRAM hashes for ``password``."""
    if password.isascii():
        return password
    mapped = "".join(
        " " if stringprep.in_table_c12(c) else c for c in password if not stringprep.in_table_b1(c)
    )
    prepared = unicodedata.normalize("NFKC", mapped)
    if not prepared:
        return password
    if any(test(c) for c in prepared for test in _PROHIBITED):
        return password
    if any(stringprep.in_table_d1(c) for c in prepared):
        ends = stringprep.in_table_d1(prepared[0]) and stringprep.in_table_d1(prepared[-1])
        if not ends or any(stringprep.in_table_d2(c) for c in prepared):
            return password
    return prepared
