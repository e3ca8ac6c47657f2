"""Reads of the wallets app. Every `*_get` takes the principal's scope and raises `NotFound`
for an object that does not exist *or* belongs to someone else (SPEC 4)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import Any, TypedDict, TypeVar

from django.apps import apps
from django.contrib.auth.models import User
from django.db import connection
from django.db.models import F, ForeignKey, Model, Q, QuerySet, Sum
from django.utils import timezone

from tenants.selectors import tenant_current
from wallets.daily_totals import MIGRATION as DAILY_TOTALS
from wallets.daily_totals import utc_day
from wallets.errors import AssetUnknown, NotFound
from wallets.models import (
    Account,
    AccountDailyTotal,
    AccountKind,
    ApiKey,
    Asset,
    Balance,
    Customer,
    LedgerEntry,
    LedgerTransaction,
    LedgerTransactionKind,
    Merchant,
    PrincipalType,
    StaffMember,
    Store,
    SystemRole,
    Terminal,
)
from wallets.staged.phases import reads_new, staged_phase

M = TypeVar("M", bound=Model)


def api_key_hash(raw_key: str) -> str:
    # Keys are long random strings, so a plain SHA-256 (no salt, no stretching) is enough
    # and lets us find the key by its hash in one indexed lookup.
    return hashlib.sha256(raw_key.encode("utf-8")).hexdigest()


def api_key_get_active(*, raw_key: str) -> ApiKey | None:
    """The live key row for `raw_key` with its principal, or None (unknown, revoked, expired).
    Most requests take it from wallets.keycache instead."""
    return api_key_get_active_by_hash(key_hash=api_key_hash(raw_key))


def api_key_get_active_by_hash(*, key_hash: str) -> ApiKey | None:
    live = Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())
    key = ApiKey.objects.filter(live, key_hash=key_hash, revoked_at__isnull=True).first()
    if key is None:
        return None
    # The principal may be cached (wallets.keycache): only columns no write changes after
    # creation (a customer's contact and a staff member's login load fresh).
    if key.customer_id is not None:
        key.customer = Customer.objects.only(*_CUSTOMER_PRINCIPAL_FIELDS).filter(pk=key.customer_id).first()
    elif key.merchant_id is not None:
        key.merchant = Merchant.objects.filter(pk=key.merchant_id).first()
    elif key.terminal_id is not None:
        terminal = Terminal.objects.select_related("store").filter(pk=key.terminal_id).first()
        if terminal is None:
            return None
        key.terminal = terminal
    elif key.staff_id is not None:
        staff = StaffMember.objects.filter(pk=key.staff_id).first()
        # A deactivated login stops its keys (a cached key: the admin face reads the login).
        if staff is None or staff_login_active(staff=staff) is None:
            return None
        key.staff = staff
    return key


_CUSTOMER_PRINCIPAL_FIELDS = ("id", "name", "created")


def ledger_unbalanced_transactions() -> list[tuple[str, str, int]]:
    """(transaction id, asset, sum) wherever a transaction's entries do not sum to zero."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT transaction_id, asset_id, SUM(amount) FROM wallets_ledgerentry GROUP BY transaction_id, asset_id HAVING SUM(amount) <> 0"
        )
        return [(str(t), str(a), int(s)) for t, a, s in cursor.fetchall()]


def balance_entry_mismatches() -> list[tuple[str, str, int, int]]:
    """(account, asset, balance, sum of entries) wherever a balance differs from its entries."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH b AS (SELECT account_id, asset_id, SUM(balance) AS total FROM wallets_balance GROUP BY 1, 2),
                 e AS (SELECT account_id, asset_id, SUM(amount) AS total FROM wallets_ledgerentry GROUP BY 1, 2)
            SELECT COALESCE(b.account_id, e.account_id), COALESCE(b.asset_id, e.asset_id), COALESCE(b.total, 0), COALESCE(e.total, 0)
              FROM b FULL OUTER JOIN e ON b.account_id = e.account_id AND b.asset_id = e.asset_id
             WHERE COALESCE(b.total, 0) <> COALESCE(e.total, 0)
            """
        )
        return [(str(acc), str(asset), int(bal), int(ent)) for acc, asset, bal, ent in cursor.fetchall()]


def asset_totals() -> dict[str, int]:
    """Sum of every balance per asset: zero when money is conserved (system accounts hold the other side)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT asset_id, SUM(balance) FROM wallets_balance GROUP BY asset_id")
        return {str(asset): int(total) for asset, total in cursor.fetchall()}


# Tenant apps whose hot append-only tables have foreign keys without a database constraint.
_TENANT_APP_LABELS = ("wallets", "payments", "idempotency", "webhooks")


def _unconstrained_relations() -> list[tuple[type[Model], ForeignKey[Any, Any]]]:
    relations = []
    for label in _TENANT_APP_LABELS:
        for model in apps.get_app_config(label).get_models():
            for field in model._meta.concrete_fields:
                if isinstance(field, ForeignKey) and not getattr(field, "db_constraint", True):
                    relations.append((model, field))
    return sorted(relations, key=lambda r: (r[0]._meta.db_table, str(r[1].column)))


def unconstrained_references() -> list[tuple[str, str, str, str]]:
    """(table, column, target table, target column) of every tenant foreign key declared
    with `db_constraint=False` (their targets are guarded by triggers, wallets/0006)."""
    return [
        (model._meta.db_table, str(field.column), field.target_field.model._meta.db_table, str(field.target_field.column))
        for model, field in _unconstrained_relations()
    ]


def ledger_orphan_references_iter(*, chunk_size: int = 2000) -> Iterator[tuple[str, str, str, tuple[type[Model], type[Model]]]]:
    """`ledger_orphan_references`, streamed, each with its (source model, target model)."""
    qn = connection.ops.quote_name
    for model, field in _unconstrained_relations():
        table, column = model._meta.db_table, str(field.column)
        target = field.target_field
        # Identifiers come from model metadata (never input), quoted.
        ref, tgt = f"r.{qn(column)}", f"t.{qn(str(target.column))}"
        sql = (
            f"SELECT DISTINCT {ref} FROM {qn(table)} r WHERE {ref} IS NOT NULL "  # noqa: S608
            f"AND NOT EXISTS (SELECT 1 FROM {qn(target.model._meta.db_table)} t WHERE {tgt} = {ref}) ORDER BY 1"
        )
        with connection.chunked_cursor() as cursor:
            cursor.execute(sql)
            while rows := cursor.fetchmany(chunk_size):
                for (value,) in rows:
                    yield table, column, str(value), (model, target.model)


def ledger_orphan_references() -> list[tuple[str, str, str]]:
    """(table, column, value) of each dangling unconstrained reference (one anti-join per
    relation). Empty when sound."""
    return [(table, column, value) for table, column, value, _ in ledger_orphan_references_iter()]


def _first_or_not_found(rows: QuerySet[M], kind: str, param: str | None) -> M:
    found = rows.first()
    if found is None:
        raise NotFound(f"no such {kind}", param=param)
    return found


def customer_get(*, customer_id: str, param: str | None = None) -> Customer:
    return _first_or_not_found(Customer.objects.select_related("account").filter(pk=customer_id), "customer", param)


def customer_list() -> QuerySet[Customer]:
    return Customer.objects.select_related("account")


def merchant_get(*, merchant_id: str, param: str | None = None) -> Merchant:
    return _first_or_not_found(Merchant.objects.filter(pk=merchant_id), "merchant", param)


def merchant_list() -> QuerySet[Merchant]:
    return Merchant.objects.all()


def store_get(*, store_id: str, merchant_id: str | None = None, param: str | None = None) -> Store:
    qs = Store.objects.filter(pk=store_id)
    if merchant_id is not None:
        qs = qs.filter(merchant_id=merchant_id)
    return _first_or_not_found(qs, "store", param)


def store_list(*, merchant_id: str | None = None) -> QuerySet[Store]:
    qs = Store.objects.all()
    return qs if merchant_id is None else qs.filter(merchant_id=merchant_id)


def terminal_get(*, terminal_id: str, merchant_id: str | None = None, param: str | None = None) -> Terminal:
    qs = Terminal.objects.select_related("store").filter(pk=terminal_id)
    if merchant_id is not None:
        qs = qs.filter(store__merchant_id=merchant_id)
    return _first_or_not_found(qs, "terminal", param)


def terminal_list(*, merchant_id: str | None = None, store_id: str | None = None) -> QuerySet[Terminal]:
    qs = Terminal.objects.select_related("store")
    if merchant_id is not None:
        qs = qs.filter(store__merchant_id=merchant_id)
    if store_id is not None:
        qs = qs.filter(store_id=store_id)
    return qs


def staff_get(*, staff_id: str, param: str | None = None) -> StaffMember:
    return _first_or_not_found(StaffMember.objects.filter(pk=staff_id), "staff member", param)


def staff_login_active(*, staff: StaffMember) -> User | None:
    """The staff member's login, read now (never cached), or None when deactivated or no
    longer staff: so a change holds from the next request on."""
    return User.objects.filter(pk=staff.user_id, is_active=True, is_staff=True).first()


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
    return _first_or_not_found(ApiKey.objects.filter(pk=api_key_id), "api key", None)


def api_key_list(*, principal_type: str | None = None, principal_id: str | None = None) -> QuerySet[ApiKey]:
    qs = ApiKey.objects.all()
    if principal_type:
        qs = qs.filter(principal_type=principal_type)
    if principal_id:
        qs = qs.filter(Q(customer_id=principal_id) | Q(merchant_id=principal_id) | Q(terminal_id=principal_id) | Q(staff_id=principal_id))
    return qs


def asset_get(*, asset_code: object, param: str = "asset") -> Asset:
    if not isinstance(asset_code, str) or not asset_code:
        raise AssetUnknown(param=param)
    asset = Asset.objects.filter(code=asset_code).first()
    if asset is None:
        raise AssetUnknown(f"unknown asset: {asset_code[:20]}", param=param)
    return asset


def asset_codes_list(*, kinds: tuple[str, ...] | None = None) -> list[str]:
    """This tenant's asset codes (of these kinds, if given), in code order."""
    assets = Asset.objects.order_by("code")
    if kinds is not None:
        assets = assets.filter(kind__in=kinds)
    return list(assets.values_list("code", flat=True))


def asset_exists(*, asset_code: str) -> bool:
    return Asset.objects.filter(code=asset_code).exists()


def account_of(*, party: Customer | Merchant) -> Account:
    if isinstance(party, Customer):
        return Account.objects.get(customer_id=party.pk)
    return Account.objects.get(merchant_id=party.pk)


def customer_accounts_get(*, customer_ids: list[str]) -> dict[str, Account]:
    """Customer id -> account, in one query (frozen flags as of now)."""
    return {str(account.customer_id): account for account in Account.objects.filter(customer_id__in=customer_ids)}


@dataclass(frozen=True)
class MovementAccounts:
    """The accounts one customer <-> merchant movement touches, read in one query."""

    customer: Account | None
    merchant: Account | None
    system: dict[str, Account]

    def system_account(self, role: SystemRole) -> Account:
        return self.system[role]


def movement_accounts_get(*, customer_id: str | None, merchant_id: str | None, system_roles: tuple[SystemRole, ...] = ()) -> MovementAccounts:
    """The customer's, the merchant's and the named system accounts, in one query (frozen
    flags as of now)."""
    match = Q(system_role__in=system_roles) if system_roles else Q(pk__in=[])
    if customer_id is not None:
        match |= Q(customer_id=customer_id)
    if merchant_id is not None:
        match |= Q(merchant_id=merchant_id)
    customer = merchant = None
    system: dict[str, Account] = {}
    for account in Account.objects.filter(match):
        if account.kind == AccountKind.CUSTOMER:
            customer = account
        elif account.kind == AccountKind.MERCHANT:
            merchant = account
        else:
            system[str(account.system_role)] = account
    return MovementAccounts(customer=customer, merchant=merchant, system=system)


def system_account_get(*, role: SystemRole) -> Account:
    return Account.objects.get(system_role=role)


class BalanceLine(TypedDict):
    asset: str
    balance: int
    available: int
    held: int


def account_balance(*, account: Account, asset_code: str) -> tuple[int, int]:
    """(balance, held) of an account in one asset: the SUM over its shards."""
    totals = Balance.objects.filter(account=account, asset_id=asset_code).aggregate(balance=Sum("balance"), held=Sum("held"))
    return int(totals["balance"] or 0), int(totals["held"] or 0)


def account_balance_lines(*, account: Account) -> list[BalanceLine]:
    """Every asset of the tenant, main currency first (a new wallet shows its zeros), each the
    SUM over the account's shards."""
    totals = {
        row["asset_id"]: (int(row["balance"]), int(row["held"]))
        for row in Balance.objects.filter(account=account).values("asset_id").annotate(balance=Sum("balance"), held=Sum("held"))
    }
    lines: list[BalanceLine] = []
    for code in Asset.objects.order_by("-is_main", "code").values_list("code", flat=True):
        balance, held = totals.get(code, (0, 0))
        lines.append({"asset": code, "balance": balance, "available": balance - held, "held": held})
    return lines


@dataclass(frozen=True)
class MerchantFunds:
    """A merchant's funds in one asset: available + pending = balance - held, both >= 0 (a
    merchant's balance covers its held, a CHECK). Credits younger than the settlement delay
    are pending (not a failed payout's money coming back), and debits draw on available
    first (docs/ARCHITECTURE.md, "Pending and available")."""

    asset_code: str
    balance: int
    held: int
    pending: int
    available: int

    @classmethod
    def of(cls, *, asset_code: str, balance: int, held: int, recent_credits: int) -> MerchantFunds:
        """The split of `balance` and `held` (locked or read sums) given the pending credits of
        the settlement delay's window (`merchant_recent_credits`). Pure: no query. Callers go
        through `merchant_funds_split`."""
        available = max(0, balance - held - recent_credits)
        return cls(asset_code=asset_code, balance=balance, held=held, pending=balance - held - available, available=available)


def merchant_settlement_delay_days(*, merchant: Merchant) -> int:
    """The merchant's override, else its tenant's setting. Pass the merchant as read now
    (`merchant_get`), not an API key's cached principal."""
    if merchant.settlement_delay_days is not None:
        return int(merchant.settlement_delay_days)
    return int(tenant_current().settlement_delay_days)


def merchant_recent_credits(*, account_id: str, asset_code: str, delay_days: int, now: datetime) -> int:
    """What the merchant account was credited in `asset_code` that is still pending at `now`:
    a credit on UTC day D is available from 00:00 UTC of D + `delay_days` + 1, so it waits
    between `delay_days` and `delay_days` + 1 days, never less than `delay_days` full days.
    A failed or canceled payout's money coming back (PAYOUT_BACK) is never pending: it was
    available when it left, and is again at once. No lock."""
    return _recent_credits(account_id=account_id, asset_codes=[asset_code], delay_days=delay_days, now=now).get(asset_code, 0)


def _recent_credits(*, account_id: str, asset_codes: list[str], delay_days: int, now: datetime) -> dict[str, int]:
    """Pending credits per asset of the window's UTC days (today and the `delay_days` before
    it), payout money coming back left out: from the daily totals (credited - returned) once
    the tenant reads them (verify proved them complete), else from the window's ledger
    entries alone (the (account, created) index) less those of the window's PAYOUT_BACK
    transactions (their partial index). Never the whole history."""
    if delay_days <= 0 or not asset_codes:
        return {}
    # Conservative by a day: counting today and only delay - 1 days before would free a
    # credit of 23:59:50 ten seconds later with a delay of 1.
    first_day = utc_day(now) - timedelta(days=delay_days)
    rows: Iterable[Mapping[str, Any]]
    if reads_new(staged_phase(DAILY_TOTALS)):
        days = AccountDailyTotal.objects.filter(account_id=account_id, asset_id__in=asset_codes, day__gte=first_day)
        rows = days.values("asset_id").annotate(total=Sum(F("credited") - F("returned")))
    else:
        since = datetime.combine(first_day, time.min, tzinfo=UTC)
        entries = LedgerEntry.objects.filter(account_id=account_id, created__gte=since, asset_id__in=asset_codes, amount__gt=0)
        # The window's PAYOUT_BACK transactions, every merchant's (few: their partial index),
        # hashed once; looking up each credit's transaction for its kind cost 3x the read.
        # An entry's `created` is its transaction's (ledger_rows_new).
        back = LedgerTransaction.objects.filter(kind=LedgerTransactionKind.PAYOUT_BACK, created__gte=since).values("pk")
        rows = entries.exclude(transaction_id__in=back).values("asset_id").annotate(total=Sum("amount"))
    return {str(row["asset_id"]): int(row["total"]) for row in rows}


def merchant_funds_split(*, account_id: str, delay_days: int, sums: Mapping[str, tuple[int, int]], now: datetime) -> list[MerchantFunds]:
    """The one split of a merchant account's (balance, held) per asset (`sums`, in the order
    given) into available and pending, by `delay_days` at `now`. Both views of a merchant's
    funds go through it, so they cannot drift: `merchant_funds` (GET /v1/merchant/balance,
    the back office) with read sums, and a payout (payments.services.payouts) with the sums of
    the rows it locked. One query for the window's pending credits, none when no asset has
    anything to spend. No lock."""
    spendable = [code for code, (balance, held) in sums.items() if balance > held]
    recent = _recent_credits(account_id=account_id, asset_codes=spendable, delay_days=delay_days, now=now)
    return [
        MerchantFunds.of(asset_code=code, balance=balance, held=held, recent_credits=recent.get(code, 0))
        for code, (balance, held) in sums.items()
    ]


def merchant_funds(*, merchant: Merchant, now: datetime | None = None) -> list[MerchantFunds]:
    """The merchant's funds per asset (every account has a row per asset), main currency first.
    Reads, no lock: a payout locks the balance rows and splits their sums itself, through
    the same `merchant_funds_split`."""
    account = Account.objects.only("pk").get(merchant_id=merchant.pk)
    # Two reads, not one snapshot: a posting committed between them can move this answer's
    # split by its amount (never the sum, nor below zero). A payout locks the rows first.
    lines = account_balance_lines(account=account)
    return merchant_funds_split(
        account_id=account.pk, delay_days=merchant_settlement_delay_days(merchant=merchant),
        sums={line["asset"]: (line["balance"], line["held"]) for line in lines}, now=now or timezone.now(),
    )
