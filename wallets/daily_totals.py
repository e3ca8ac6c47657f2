"""Daily totals: what the ledger posted to each account per UTC day and asset (and, of a
merchant's credits, what failed or canceled payouts brought back), kept by the posting
itself; and the two staged migrations that build them from the ledger (the source of truth,
which stays) under live traffic: `merchant_daily_totals` (merchant accounts: the balance
history, the pending window) and `account_daily_totals` (every other account, customers and
system: the balances at an instant, wallets.books). Each kind of account is read from the
summary only once its migration switched reads.

The backfill locks every balance row of a batch of accounts (as a merchant debit does),
so no posting adds to their totals while it recomputes them from the ledger: it never
deadlocks a payment, and what it writes is exact. It rewrites only the keys that differ.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from itertools import groupby
from typing import Any, Final

from django.db import connection
from django.db.models import Case, Count, Exists, F, Max, Min, OuterRef, Q, QuerySet, Sum, Value, When
from django.db.models.functions import TruncDate

from wallets.locks import connection_shard, merchant_balance_rows_lock
from wallets.models import Account, AccountDailyTotal, AccountKind, LedgerEntry, LedgerTransactionKind
from wallets.staged.phases import reads_new, staged_phase, writes_new
from wallets.staged.runner import staged_start_contracted
from wallets.staged.spec import BatchResult, StagedMigration, VerifyReport, discard_in_batches, verify_snapshot

MIGRATION: Final = "merchant_daily_totals"
ACCOUNTS_MIGRATION: Final = "account_daily_totals"

Key = tuple[str, str, date]  # (account id, asset code, day)
Totals = tuple[int, int, int, int]  # (credited, debited, entries, returned)
_SUM_FIELDS = ("credited", "debited", "entries", "returned")


@dataclass(frozen=True)
class DailyTotal:
    """A merchant's day in one asset: credited and debited (both >= 0), net, entries."""

    merchant: str
    asset: str
    day: date
    credited: int
    debited: int
    entries: int

    @property
    def net(self) -> int:
        return self.credited - self.debited


def utc_day(moment: datetime) -> date:
    return moment.astimezone(UTC).date()


def migration_of(kind: str) -> str:
    """The staged migration that builds the daily totals of accounts of `kind`."""
    return MIGRATION if kind == AccountKind.MERCHANT else ACCOUNTS_MIGRATION


def daily_totals_read(*, kind: str) -> bool:
    """Whether the daily totals of accounts of `kind` are complete and read (their staged
    migration switched reads); before that, reads sum the ledger."""
    return reads_new(staged_phase(migration_of(kind)))


def _kinds_match(migration: str) -> Q:
    merchants = Q(account__kind=AccountKind.MERCHANT)
    return merchants if migration == MIGRATION else ~merchants


def account_daily_totals_record(*, kind: str, legs: Iterable[tuple[Account, str, int]], created: datetime) -> None:
    """Add a posting's legs (account, asset, amount) to the day's totals, for the kinds of
    account whose staged migration's phase writes them (ledger_post, after its entries); a
    merchant's credit of a `kind` PAYOUT_BACK counts as `returned` too. One statement: a
    day's first posting on a shard inserts the row, the others add to it.

    Locks: each leg's summary row on this connection's shard, in key order, after the
    posting's balance rows: a merchant's or system account's on that shard (or every shard),
    a customer's single row; whoever else writes the summary row holds that one first, so
    it adds no wait."""
    totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    back = kind == LedgerTransactionKind.PAYOUT_BACK
    writing: dict[str, bool] = {}
    for account, asset, amount in legs:
        migration = migration_of(account.kind)
        if migration not in writing:
            writing[migration] = writes_new(staged_phase(migration))
        if not writing[migration]:
            continue
        line = totals[(account.id, asset)]
        line[0 if amount > 0 else 1] += abs(amount)
        line[2] += 1
        line[3] += amount if back and amount > 0 and account.kind == AccountKind.MERCHANT else 0
    if not totals:
        return
    day, shard = utc_day(created), connection_shard()
    rows = sorted(totals.items())
    params: list[Any] = []
    for (account_id, asset), sums in rows:
        params += [account_id, asset, day, shard, *sums]
    with connection.cursor() as cursor:
        cursor.execute(_UPSERT_SQL.format(rows=", ".join([_UPSERT_ROW] * len(rows))), params)


# Every leg's row in one round trip, in key order: a day's first posting on a shard inserts
# it, the others add to it (ON CONFLICT on the key's unique index; no savepoint).
_UPSERT_ROW = "(%s, %s, %s::date, %s::smallint, %s::bigint, %s::bigint, %s::bigint, %s::bigint)"
_UPSERT_SQL = """
INSERT INTO wallets_merchantdailytotal AS t (account_id, asset_id, day, shard, credited, debited, entries, returned)
VALUES {rows}
ON CONFLICT (account_id, asset_id, day, shard) DO UPDATE SET
    credited = t.credited + EXCLUDED.credited, debited = t.debited + EXCLUDED.debited,
    entries = t.entries + EXCLUDED.entries, returned = t.returned + EXCLUDED.returned
"""


def _ledger_totals(entries: QuerySet[LedgerEntry], *, returned: bool = True) -> Any:
    """Totals per (account, asset, UTC day) from the entries; `returned` (a merchant's
    PAYOUT_BACK credits) joins each entry's transaction for its kind, so a read that shows
    no `returned` (the balance history) leaves it at 0 and skips the join."""
    sums = {
        "s_credited": Sum(Case(When(amount__gt=0, then=F("amount")), default=Value(0))),
        "s_debited": Sum(Case(When(amount__lt=0, then=-F("amount")), default=Value(0))),
        "s_entries": Count("id"),
    }
    if returned:
        back = Q(amount__gt=0, transaction__kind=LedgerTransactionKind.PAYOUT_BACK, account__kind=AccountKind.MERCHANT)
        sums["s_returned"] = Sum(Case(When(back, then=F("amount")), default=Value(0)))
    return entries.annotate(day=TruncDate("created", tzinfo=UTC)).values("account_id", "account__merchant_id", "asset_id", "day").annotate(**sums)


def _summary_totals(rows: QuerySet[AccountDailyTotal]) -> Any:
    return rows.values("account_id", "account__merchant_id", "asset_id", "day").annotate(
        s_credited=Sum("credited"), s_debited=Sum("debited"), s_entries=Sum("entries"), s_returned=Sum("returned")
    )


def merchant_daily_totals(
    *, merchant_id: str | None = None, asset_code: str | None = None, day_from: date | None = None, day_to: date | None = None
) -> list[DailyTotal]:
    """Daily totals per merchant and asset between `day_from` and `day_to` (inclusive, UTC
    days), newest day first; one merchant or (None) every merchant. From the ledger until
    the tenant's reads switch, from the summary after (verify proves them equal)."""
    match = Q(account__kind=AccountKind.MERCHANT)
    if merchant_id is not None:
        match &= Q(account__merchant_id=merchant_id)
    if asset_code:
        match &= Q(asset_id=asset_code)
    if reads_new(staged_phase(MIGRATION)):
        totals = _summary_totals(AccountDailyTotal.objects.filter(match, _days(day_from, day_to, ledger=False)))
    else:
        totals = _ledger_totals(LedgerEntry.objects.filter(match, _days(day_from, day_to, ledger=True)), returned=False)
    found = (DailyTotal(str(r["account__merchant_id"]), str(r["asset_id"]), r["day"], *_sums(r)[:3]) for r in totals)
    return sorted(found, key=lambda t: (t.day, t.merchant, t.asset), reverse=True)


def _days(day_from: date | None, day_to: date | None, *, ledger: bool) -> Q:
    """The UTC days `day_from`..`day_to` (None: open), of ledger entries or of summary rows."""
    match = Q()
    if day_from is not None:
        match &= Q(created__gte=_midnight(day_from)) if ledger else Q(day__gte=day_from)
    if day_to is not None:
        match &= Q(created__lt=_midnight(day_to + timedelta(days=1))) if ledger else Q(day__lte=day_to)
    return match


def merchant_daily_totals_differences(*, day_from: date, day_to: date) -> list[tuple[Key, Totals | None, Totals | None]]:
    """Each (merchant account, asset, UTC day) between `day_from` and `day_to` (inclusive)
    whose summary (shards summed) differs from the ledger, as (key, ledger, summary), each
    (credited, debited, entries, returned).
    Run it in one snapshot (reconciliation's runs are REPEATABLE READ)."""
    return daily_totals_differences(migration=MIGRATION, day_from=day_from, day_to=day_to)


def daily_totals_differences(*, migration: str, day_from: date, day_to: date) -> list[tuple[Key, Totals | None, Totals | None]]:
    """As merchant_daily_totals_differences, for the accounts `migration` builds (MIGRATION:
    merchants; ACCOUNTS_MIGRATION: every other account)."""
    kinds = _kinds_match(migration)
    truth = _keyed(_ledger_totals(LedgerEntry.objects.filter(kinds, _days(day_from, day_to, ledger=True))))
    summary = _keyed(_summary_totals(AccountDailyTotal.objects.filter(kinds, _days(day_from, day_to, ledger=False))))
    return [(key, truth.get(key), summary.get(key)) for key in _differing(truth, summary)]


# Per (account, asset) of the kind: its latest day in the summary or in the ledger (the
# entry found backwards through ledgerentry_account_created), that day's totals on both sides.
_LATEST_SQL = """
WITH keys AS (SELECT DISTINCT b.account_id, b.asset_id FROM wallets_balance b JOIN wallets_account a ON a.id = b.account_id
               WHERE (a.kind = 'merchant') = %(merchants)s),
     latest AS (SELECT k.account_id, k.asset_id, GREATEST(
                  (SELECT MAX(d.day) FROM wallets_merchantdailytotal d WHERE d.account_id = k.account_id AND d.asset_id = k.asset_id),
                  (SELECT (e.created AT TIME ZONE 'UTC')::date FROM wallets_ledgerentry e
                    WHERE e.account_id = k.account_id AND e.asset_id = k.asset_id ORDER BY e.created DESC LIMIT 1)) AS day
                  FROM keys k)
SELECT l.account_id, l.asset_id, l.day, t.credited, t.debited, t.entries, s.credited, s.debited, s.entries
  FROM latest l
  CROSS JOIN LATERAL (SELECT COALESCE(SUM(GREATEST(e.amount, 0)), 0) AS credited, COALESCE(SUM(GREATEST(-e.amount, 0)), 0) AS debited,
                             COUNT(*) AS entries FROM wallets_ledgerentry e
                       WHERE e.account_id = l.account_id AND e.asset_id = l.asset_id
                         AND e.created >= l.day::timestamp AT TIME ZONE 'UTC' AND e.created < (l.day + 1)::timestamp AT TIME ZONE 'UTC') t
  CROSS JOIN LATERAL (SELECT COALESCE(SUM(d.credited), 0) AS credited, COALESCE(SUM(d.debited), 0) AS debited,
                             COALESCE(SUM(d.entries), 0) AS entries FROM wallets_merchantdailytotal d
                       WHERE d.account_id = l.account_id AND d.asset_id = l.asset_id AND d.day = l.day) s
 WHERE l.day IS NOT NULL AND (t.credited, t.debited, t.entries) IS DISTINCT FROM (s.credited, s.debited, s.entries)
 ORDER BY 1, 2
"""


def daily_totals_latest_differences(*, migration: str, chunk_size: int = 2000) -> Iterator[tuple[Key, Totals, Totals]]:
    """For each (account, asset) of the kind `migration` builds, its latest day (in the
    summary or in the ledger, whichever is later) whose summary differs from the ledger, as
    (key, ledger, summary), each (credited, debited, entries, 0): where a balance at an
    instant stops adding up summary rows and starts adding up entries, checked for an
    account quiet for longer than any window. One day per account through its index,
    streamed. Run it in one snapshot."""
    with connection.chunked_cursor() as cursor:
        cursor.execute(_LATEST_SQL, {"merchants": migration == MIGRATION})
        while rows := cursor.fetchmany(chunk_size):
            for account_id, asset_id, day, t_cr, t_db, t_n, s_cr, s_db, s_n in rows:
                yield ((str(account_id), str(asset_id), day), (int(t_cr), int(t_db), int(t_n), 0), (int(s_cr), int(s_db), int(s_n), 0))


def _differing(truth: dict[Key, Totals], summary: dict[Key, Totals]) -> list[Key]:
    return sorted(key for key in truth.keys() | summary.keys() if truth.get(key) != summary.get(key))


def _sums(row: dict[str, Any]) -> Totals:
    return int(row["s_credited"] or 0), int(row["s_debited"] or 0), int(row["s_entries"] or 0), int(row.get("s_returned") or 0)


def _keyed(rows: Iterable[dict[str, Any]]) -> dict[Key, Totals]:
    return {(str(r["account_id"]), str(r["asset_id"]), r["day"]): _sums(r) for r in rows}


class MerchantDailyTotalsMigration(StagedMigration):
    name = MIGRATION
    description = "merchant daily totals: aggregated from the ledger on each read -> a maintained summary table"
    old_survives_contract = True
    # Accounts per batch: each window holds their balance rows while it aggregates it.
    default_batch = 5
    # Days of one account's history recomputed per transaction, at most.
    window_days = 31

    def _accounts(self) -> QuerySet[Account]:
        return Account.objects.filter(kind=AccountKind.MERCHANT)

    def backfill_total(self) -> int:
        """The accounts with a history to summarize (a new tenant's system accounts have none)."""
        return self._accounts().filter(Exists(LedgerEntry.objects.filter(account_id=OuterRef("pk")))).count()

    def backfill_batch(self, *, after: str, limit: int, dry_run: bool) -> BatchResult:
        """The history of the next `limit` merchants, at most `window_days` days of each (a
        short lock), recomputed from the ledger; keys that differ become one row on shard 0.
        The cursor is a position in the data, whatever `limit` was: `<account>` (done up to
        it) or `<account>/<day>` (done up to that day); `<account>@<day>` resumes at `<account>`.

        Locks: every balance row of the batch's merchants, one statement in the global order
        (merchant_balance_rows_lock; not with `dry_run`), then their summary rows."""
        resume_account, from_day = _position(after)
        merchants = self._accounts().order_by("pk")
        if from_day is not None:
            merchants = merchants.filter(pk__gte=resume_account)
        elif resume_account:
            merchants = merchants.filter(pk__gt=resume_account)
        ids = list(merchants.values_list("pk", flat=True)[:limit])
        if not ids:
            return BatchResult(cursor=None, rows_seen=0, rows_written=0)
        spans = _history_spans(ids, resume_account=resume_account, from_day=from_day)
        windows: dict[str, tuple[date, date]] = {}
        cursor: str | None = ids[-1] if len(ids) == limit else None
        done = 0
        for account_id in ids:
            span = spans.get(account_id)
            if span is None:  # no history left to recompute
                done += 1
                continue
            first, last = span
            end = first + timedelta(days=self.window_days)
            windows[account_id] = (first, end)
            if end <= last:  # more history of this merchant: its next window, next batch
                cursor = f"{account_id}/{end.isoformat()}"
                break
            done += 1
        if not windows:
            return BatchResult(cursor=cursor, rows_seen=done, rows_written=0)
        if not dry_run:
            merchant_balance_rows_lock(account_ids=sorted(windows))
        entries, rows = Q(), Q()
        for account_id, (start, end) in windows.items():
            entries |= Q(account_id=account_id, created__gte=_midnight(start), created__lt=_midnight(end))
            rows |= Q(account_id=account_id, day__gte=start, day__lt=end)
        truth = _keyed(_ledger_totals(LedgerEntry.objects.filter(entries)))
        summary = _keyed(_summary_totals(AccountDailyTotal.objects.filter(rows)))
        wrong = _differing(truth, summary)
        if wrong and not dry_run:
            match = Q()
            for (account_id, asset), keys in groupby(wrong, key=lambda key: key[:2]):  # `wrong` is sorted
                match |= Q(account_id=account_id, asset_id=asset, day__in=[day for _, _, day in keys])
            AccountDailyTotal.objects.filter(match).delete()
            AccountDailyTotal.objects.bulk_create(
                AccountDailyTotal(account_id=a, asset_id=s, day=d, shard=0, **dict(zip(_SUM_FIELDS, truth[(a, s, d)], strict=True)))
                for (a, s, d) in wrong
                if (a, s, d) in truth
            )
        return BatchResult(cursor=cursor, rows_seen=done, rows_written=len(wrong))

    def verify(self) -> VerifyReport:
        """Every (account, asset, day) of its kind, in one snapshot: the summary (shards summed) equals the ledger."""
        with verify_snapshot():
            kinds = _kinds_match(self.name)
            truth = _keyed(_ledger_totals(LedgerEntry.objects.filter(kinds)))
            summary = _keyed(_summary_totals(AccountDailyTotal.objects.filter(kinds)))
        report = VerifyReport()
        report.counts = {
            "ledger_days": len(truth), "summary_days": len(summary),
            "ledger_entries": sum(v[2] for v in truth.values()), "summary_entries": sum(v[2] for v in summary.values()),
        }
        report.checksums = {"ledger": _checksum(truth), "summary": _checksum(summary)}
        report.differences = [
            f"{a}/{s}/{d}: ledger {truth.get((a, s, d))} summary {summary.get((a, s, d))}"
            for a, s, d in _differing(truth, summary)
        ]
        return report

    def contract(self) -> None:
        """Nothing to drop: the ledger stays the source of truth."""

    def discard(self) -> None:
        discard_in_batches(AccountDailyTotal.objects.filter(_kinds_match(self.name)), lambda rows: rows.delete(), batch=5000)


class AccountDailyTotalsMigration(MerchantDailyTotalsMigration):
    """The same summary for every account that is not a merchant's: customers, and the
    system accounts (PSP funding, fees, payouts in transit, ...) whose balance rows are
    sharded, so their summary rows are too. The backfill locks a system account's every
    balance row while it recomputes a window: a short pause of the payments that post to it,
    so its windows are a week, not a month."""

    name = ACCOUNTS_MIGRATION
    description = "daily totals of customer and system accounts: the ledger summed on each read -> the maintained summary table"
    window_days = 7

    def _accounts(self) -> QuerySet[Account]:
        return Account.objects.exclude(kind=AccountKind.MERCHANT)


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


def _position(cursor: str) -> tuple[str, date | None]:
    """(account, day) of a backfill cursor; day None: the account is done whole."""
    account, slash, day = cursor.partition("/")
    if slash:
        return account, date.fromisoformat(day)
    return cursor.partition("@")[0], None


def _history_spans(ids: list[str], *, resume_account: str, from_day: date | None) -> dict[str, tuple[date, date]]:
    """Per merchant account, the first and last UTC day with a ledger entry or a summary
    row (for `resume_account`, from `from_day` on); accounts with none are left out."""
    entries = LedgerEntry.objects.filter(account_id__in=ids)
    rows = AccountDailyTotal.objects.filter(account_id__in=ids)
    if from_day is not None:
        entries = entries.exclude(account_id=resume_account, created__lt=_midnight(from_day))
        rows = rows.exclude(account_id=resume_account, day__lt=from_day)
    days: dict[str, list[date]] = defaultdict(list)
    for account_id, first_at, last_at in entries.values_list("account_id").annotate(Min("created"), Max("created")):
        days[account_id] += [utc_day(first_at), utc_day(last_at)]
    for account_id, first_day, last_day in rows.values_list("account_id").annotate(Min("day"), Max("day")):
        days[account_id] += [first_day, last_day]
    return {account_id: (min(known), max(known)) for account_id, known in days.items()}


def _checksum(totals: dict[Key, Totals]) -> str:
    digest = hashlib.sha256()
    for key in sorted(totals):
        digest.update(f"{key[0]}|{key[1]}|{key[2].isoformat()}|{totals[key]}\n".encode())
    return digest.hexdigest()


def daily_totals_new_tenant(**_: Any) -> None:
    """A new tenant has no ledger to summarize: its daily totals are complete from its first
    posting, so both migrations start contracted and its reads (pending funds, balances at
    an instant, the trial balance) use them at once."""
    staged_start_contracted(migration=MerchantDailyTotalsMigration())
    staged_start_contracted(migration=AccountDailyTotalsMigration())
