"""Principal-scoped reads of parties and keys for the faces.

Scoping lives here, in one place: every lookup takes the principal's scope and answers
`NotFound` for an object that does not exist *or* belongs to someone else, so the two
cases are indistinguishable to a caller (SPEC 4).
"""

from __future__ import annotations

from django.db.models import Q, QuerySet

from payments.errors import NotFound
from payments.models import Adjustment, Refund, TopUp, Transfer
from wallets.models import ApiKey, Customer, Merchant, PrincipalType, StaffMember, Store, Terminal


def _not_found(kind: str, param: str | None) -> NotFound:
    return NotFound(f"no such {kind}", param=param)


def customer_get(*, customer_id: str, param: str | None = None) -> Customer:
    customer = Customer.objects.select_related("account").filter(pk=customer_id).first()
    if customer is None:
        raise _not_found("customer", param)
    return customer


def customer_list() -> QuerySet[Customer]:
    return Customer.objects.select_related("account")


def merchant_get(*, merchant_id: str, param: str | None = None) -> Merchant:
    merchant = Merchant.objects.filter(pk=merchant_id).first()
    if merchant is None:
        raise _not_found("merchant", param)
    return merchant


def merchant_list() -> QuerySet[Merchant]:
    return Merchant.objects.all()


def store_get(*, store_id: str, merchant_id: str | None = None, param: str | None = None) -> Store:
    qs = Store.objects.filter(pk=store_id)
    if merchant_id is not None:
        qs = qs.filter(merchant_id=merchant_id)
    store = qs.first()
    if store is None:
        raise _not_found("store", param)
    return store


def store_list(*, merchant_id: str | None = None) -> QuerySet[Store]:
    qs = Store.objects.all()
    return qs if merchant_id is None else qs.filter(merchant_id=merchant_id)


def terminal_get(*, terminal_id: str, merchant_id: str | None = None, param: str | None = None) -> Terminal:
    qs = Terminal.objects.select_related("store").filter(pk=terminal_id)
    if merchant_id is not None:
        qs = qs.filter(store__merchant_id=merchant_id)
    terminal = qs.first()
    if terminal is None:
        raise _not_found("terminal", param)
    return terminal


def terminal_list(*, merchant_id: str | None = None, store_id: str | None = None) -> QuerySet[Terminal]:
    qs = Terminal.objects.select_related("store")
    if merchant_id is not None:
        qs = qs.filter(store__merchant_id=merchant_id)
    if store_id is not None:
        qs = qs.filter(store_id=store_id)
    return qs


def staff_get(*, staff_id: str, param: str | None = None) -> StaffMember:
    staff = StaffMember.objects.filter(pk=staff_id).first()
    if staff is None:
        raise _not_found("staff member", param)
    return staff


def principal_get(*, principal_type: str, principal_id: str) -> Customer | Merchant | Terminal | StaffMember:
    param = "principal_id"
    if principal_type == PrincipalType.CUSTOMER:
        return customer_get(customer_id=principal_id, param=param)
    if principal_type == PrincipalType.MERCHANT:
        return merchant_get(merchant_id=principal_id, param=param)
    if principal_type == PrincipalType.TERMINAL:
        return terminal_get(terminal_id=principal_id, param=param)
    return staff_get(staff_id=principal_id, param=param)


def api_key_get(*, api_key_id: str) -> ApiKey:
    api_key = ApiKey.objects.filter(pk=api_key_id).first()
    if api_key is None:
        raise _not_found("api key", None)
    return api_key


def api_key_list(*, principal_type: str | None = None, principal_id: str | None = None) -> QuerySet[ApiKey]:
    qs = ApiKey.objects.all()
    if principal_type:
        qs = qs.filter(principal_type=principal_type)
    if principal_id:
        qs = qs.filter(Q(customer_id=principal_id) | Q(merchant_id=principal_id) | Q(terminal_id=principal_id) | Q(staff_id=principal_id))
    return qs


# --- Money objects not covered by payments.selectors -------------------------------------


def refunds_list(*, merchant_id: str | None = None, customer_id: str | None = None, store_id: str | None = None) -> QuerySet[Refund]:
    if not (merchant_id or customer_id or store_id):
        raise ValueError("refunds_list needs a scope")  # an unscoped list would leak every refund
    qs = Refund.objects.select_related("payment")
    if merchant_id:
        qs = qs.filter(payment__merchant_id=merchant_id)
    if customer_id:
        qs = qs.filter(payment__customer_id=customer_id)
    if store_id:
        qs = qs.filter(payment__store_id=store_id)
    return qs


def transfers_list(*, customer_id: str) -> QuerySet[Transfer]:
    return Transfer.objects.filter(Q(from_customer_id=customer_id) | Q(to_customer_id=customer_id))


def topups_list(*, customer_id: str) -> QuerySet[TopUp]:
    return TopUp.objects.filter(customer_id=customer_id)


def adjustments_list() -> QuerySet[Adjustment]:
    return Adjustment.objects.all()


def adjustment_get(*, adjustment_id: str) -> Adjustment:
    adjustment = Adjustment.objects.filter(pk=adjustment_id).first()
    if adjustment is None:
        raise _not_found("adjustment", None)
    return adjustment

