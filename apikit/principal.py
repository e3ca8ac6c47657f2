"""Who is calling: set by API-key authentication as `request.user`."""

from __future__ import annotations

from dataclasses import dataclass

from wallets.models import ApiKey, Customer, Merchant, StaffMember, Terminal

# Which principal type each face accepts (SPEC 4); any other principal gets 403.
FACE_PRINCIPAL_TYPES = {"customer": "customer", "terminal": "terminal", "merchant": "merchant", "admin": "staff"}


@dataclass(frozen=True)
class Principal:
    type: str  # "customer" | "merchant" | "terminal" | "staff"
    id: str  # cus_..., mer_..., ter_..., stf_...
    obj: Customer | Merchant | Terminal | StaffMember
    api_key: ApiKey

    # DRF and Django look for these on request.user.
    is_authenticated = True
    is_anonymous = False

    @property
    def merchant_id(self) -> str | None:
        if isinstance(self.obj, Merchant):
            return self.obj.id
        if isinstance(self.obj, Terminal):
            return str(self.obj.store.merchant_id)
        return None

    @property
    def store_id(self) -> str | None:
        if isinstance(self.obj, Terminal):
            return str(self.obj.store_id)
        return None


def principal_from_api_key(api_key: ApiKey) -> Principal:
    obj = api_key.customer or api_key.merchant or api_key.terminal or api_key.staff
    if obj is None:  # the database CHECK makes this impossible; refuse rather than guess
        raise ValueError(f"api key {api_key.id} has no principal")
    return Principal(type=str(api_key.principal_type), id=str(obj.pk), obj=obj, api_key=api_key)
