"""Who is calling: set by API-key authentication as `request.user`."""

from __future__ import annotations

from dataclasses import dataclass

from wallets.models import ApiKey, Customer, Merchant, StaffMember, Terminal


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
        """The merchant a merchant or terminal principal acts for."""
        if isinstance(self.obj, Merchant):
            return self.obj.id
        if isinstance(self.obj, Terminal):
            return str(self.obj.store.merchant_id)
        return None
