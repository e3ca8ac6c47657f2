"""Fee schedules: added, never edited. A payment takes the fee of the schedule in force at
its time (payments.selectors.fee_terms_in_force, in `charges`); a refund gives back its
share (`refunds`). How the fee moves in the ledger: docs/ARCHITECTURE.md, "Fees"."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from payments.errors import FeeScheduleStartRefused
from payments.models import FEE_RATE_PLACES, FeeRounding, FeeSchedule
from payments.selectors import fee_schedule_earliest_start, fee_terms_forget
from wallets.errors import InvalidRequest
from wallets.models import Merchant
from wallets.money import MAX_AMOUNT
from wallets.selectors import asset_get
from wallets.services.audit import audit_record
from wallets.transactions import atomic_service

RATE_STEP = Decimal(1).scaleb(-FEE_RATE_PLACES)


@atomic_service(operation="fee_schedule_create")
def fee_schedule_create(
    *, asset_code: str, merchant: Merchant | None = None, rate: object, rounding: str = FeeRounding.HALF_EVEN, fixed: object = 0,
    valid_from: datetime | None = None,
) -> FeeSchedule:
    """A new schedule for `asset_code`, tenant-wide or `merchant`'s own, from `valid_from`
    (default and earliest: `fee_schedule_earliest_start`, once every process can know it),
    audited. Refuses a float or out-of-range rate, an unknown rounding, a negative fixed part
    (InvalidRequest), an earlier start, a second schedule starting at the same time, and a
    start less than the cache's life after the database's clock at the end of the transaction
    (FeeScheduleStartRefused, nothing written). Locks: none (a new row)."""
    if not isinstance(rate, Decimal) or not rate.is_finite() or not 0 <= rate <= 1 or rate != rate.quantize(RATE_STEP):
        raise InvalidRequest(f"rate must be a decimal from 0 to 1 with at most {FEE_RATE_PLACES} places", param="rate")
    if rounding not in FeeRounding.values:
        raise InvalidRequest(f"rounding must be one of {', '.join(FeeRounding.values)}", param="rounding")
    if isinstance(fixed, bool) or not isinstance(fixed, int) or not 0 <= fixed <= MAX_AMOUNT:
        raise InvalidRequest(f"fixed must be an integer from 0 to {MAX_AMOUNT} in the asset's minor unit", param="fixed")
    earliest = fee_schedule_earliest_start(now=timezone.now())
    if valid_from is None:
        valid_from = earliest
    elif valid_from < earliest:
        raise FeeScheduleStartRefused(f"valid_from must be at or after {earliest.isoformat()}: a schedule applies only to later payments")
    asset = asset_get(asset_code=asset_code)
    schedule = FeeSchedule(asset=asset, merchant=merchant, rate=rate, rounding=rounding, fixed=fixed, valid_from=valid_from)
    try:
        with transaction.atomic():  # a savepoint: a concurrent twin's start is a refusal, not an error
            schedule.save(force_insert=True)
    except IntegrityError as error:
        if getattr(getattr(error.__cause__, "diag", None), "constraint_name", None) != "fee_schedule_one_start":
            raise
        raise FeeScheduleStartRefused("a schedule for this asset and merchant already starts at valid_from") from None
    audit_record(
        action="fee_schedule.create", target_type="fee_schedule", target_id=schedule.pk,
        after={"asset": asset.code, "merchant": merchant.pk if merchant else None, "rate": str(rate), "rounding": rounding, "fixed": fixed,
               "valid_from": valid_from.isoformat()},
    )
    # Last: `earliest` came from this process's clock before the insert. A process that reads
    # the schedules just before this commit caches the old ones for the cache's life, so the
    # start must still be that far away by the database's clock now (a slow commit, a skewed
    # clock); the rollback writes nothing.
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        database_now: datetime = cursor.fetchone()[0]
    if valid_from - database_now < timedelta(seconds=float(settings.TALLY_FEE_SCHEDULE_CACHE_SECONDS)):
        raise FeeScheduleStartRefused(
            f"valid_from must be at least TALLY_FEE_SCHEDULE_CACHE_SECONDS after {database_now.isoformat()} (the database's clock)"
        )
    fee_terms_forget()  # this process at once; the others within their cache's life, before valid_from
    return schedule
