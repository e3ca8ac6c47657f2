"""A tenant's gateway credentials, sealed at rest (wallets/sealing.py, under their own
derived key), bound by associated data to the tenant schema, the gateway and the field, so
a sealed value copied elsewhere does not open."""

from __future__ import annotations

from wallets.sealing import SealScheme, secret_seal, secret_unseal

SCHEME = SealScheme(purpose=b"tally/gateways/credentials/v1", tag=b"tally-gw")


def credential_aad(schema: str, gateway: str, field: str) -> bytes:
    return f"{schema}\x00{gateway}\x00{field}".encode()


def credential_seal(*, value: str, schema: str, gateway: str, field: str) -> bytes:
    return secret_seal(scheme=SCHEME, plaintext=value.encode("utf-8"), associated_data=credential_aad(schema, gateway, field))


def credential_unseal(*, sealed: bytes, schema: str, gateway: str, field: str) -> str:
    return secret_unseal(scheme=SCHEME, sealed=sealed, associated_data=credential_aad(schema, gateway, field)).decode("utf-8")
