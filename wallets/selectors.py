"""Read selectors for parties and keys."""

from __future__ import annotations

from django.db import connection
from django.db.models import Q
from django.utils import timezone

from wallets.models import ApiKey, Customer, Merchant, StaffMember, Terminal
from wallets.services.principals import api_key_hash


def api_key_get_active(*, raw_key: str) -> ApiKey | None:
    """The live key row for `raw_key`, or None if unknown, revoked or past its overlap window.

    Two indexed single-table lookups (the key by its hash, then its one principal with what
    the principal needs): a six-table select_related of every principal type cost several
    milliseconds of planning per request under load.
    """
    now = timezone.now()
    keys = list(
        ApiKey.objects.filter(key_hash=api_key_hash(raw_key), revoked_at__isnull=True)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        .order_by()[:1]
    )
    if not keys:
        return None
    key = keys[0]
    if key.customer_id is not None:
        key.customer = Customer.objects.get(pk=key.customer_id)
    elif key.merchant_id is not None:
        key.merchant = Merchant.objects.get(pk=key.merchant_id)
    elif key.terminal_id is not None:
        key.terminal = Terminal.objects.select_related("store").get(pk=key.terminal_id)
    elif key.staff_id is not None:
        key.staff = StaffMember.objects.select_related("user").get(pk=key.staff_id)
    return key


# --- Ledger integrity (reconciliation and tests) -------------------------------------


def ledger_unbalanced_transactions() -> list[tuple[str, str, int]]:
    """(transaction id, asset, sum) of every ledger transaction whose entries do not sum to zero per asset."""
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
