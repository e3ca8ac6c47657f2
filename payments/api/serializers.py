"""Request and response shapes of the four faces: no lookups, no rules beyond a field's
syntax (rules live in the services)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apikit.base import StrictSerializer
from apikit.fields import AmountField, AssetField, AssetFilterField, ConstField, InstantFilterField, ObjectIdField, strict_char
from apikit.pagination import ListParamsSerializer, list_serializer
from apikit.shapes import ObjectOut, Serializer
from payments.models import FEE_RATE_PLACES, FeeRounding
from wallets.money import MAX_AMOUNT

S = serializers


def _ref(source: str, *, nullable: bool = False) -> S.CharField:
    return S.CharField(source=source, allow_null=nullable)


# --- Parties and keys ------------------------------------------------------------------


class CustomerOut(ObjectOut):
    object_type = "customer"
    name = S.CharField()
    email = S.CharField()
    phone = S.CharField()
    frozen = S.BooleanField(source="account.frozen")


class MerchantOut(ObjectOut):
    object_type = "merchant"
    name = S.CharField()


class StoreOut(ObjectOut):
    object_type = "store"
    merchant = _ref("merchant_id")
    name = S.CharField()


class TerminalOut(ObjectOut):
    object_type = "terminal"
    merchant = _ref("store.merchant_id")
    store = _ref("store_id")
    name = S.CharField()


class ApiKeyOut(ObjectOut):
    object_type = "api_key"
    principal_type = S.CharField()
    principal_id = S.CharField()
    prefix = S.CharField()
    expires_at = S.DateTimeField(allow_null=True)
    revoked_at = S.DateTimeField(allow_null=True)
    last_used_at = S.DateTimeField(allow_null=True)


class ApiKeyCreatedOut(ApiKeyOut):
    key = S.CharField(help_text="The secret key. Shown once: store it now, it cannot be retrieved again.")


class ApiKeyRotatedOut(ApiKeyCreatedOut):
    replaces = ApiKeyOut(help_text="The rotated key, now expiring at the end of the overlap window.")


class CustomerCreateIn(StrictSerializer):
    name = strict_char()
    email = S.EmailField(required=False, allow_blank=True, max_length=254, default="")
    phone = S.RegexField(r"^\+?[0-9 ()\-]{3,31}$", required=False, allow_blank=True, max_length=32, default="")


class ContactUpdateIn(StrictSerializer):
    """A field left out is unchanged; null or "" clears it; a value sets it."""

    email = S.EmailField(required=False, allow_null=True, allow_blank=True, max_length=254)
    phone = S.RegexField(r"^\+?[0-9 ()\-]{3,31}$", required=False, allow_null=True, allow_blank=True, max_length=32)


class ContactOut(Serializer):
    object = ConstField("contact")
    customer = S.CharField(source="id")
    email = S.CharField()
    phone = S.CharField()


class MerchantCreateIn(StrictSerializer):
    name = strict_char()


class StoreCreateIn(StrictSerializer):
    merchant = ObjectIdField("mer")
    name = strict_char()


class TerminalCreateIn(StrictSerializer):
    store = ObjectIdField("sto")
    name = strict_char()


PRINCIPAL_TYPES = ["customer", "merchant", "terminal", "staff"]


class ApiKeyCreateIn(StrictSerializer):
    principal_type = S.ChoiceField(choices=PRINCIPAL_TYPES)
    principal_id = S.RegexField(r"^(cus|mer|ter|stf)_[A-Za-z0-9]{1,40}$", max_length=48)


MAX_KEY_OVERLAP_SECONDS = 7 * 24 * 3600


class ApiKeyRotateIn(StrictSerializer):
    overlap_seconds = S.IntegerField(
        required=False, min_value=0, max_value=MAX_KEY_OVERLAP_SECONDS, default=24 * 3600,
        help_text="How long the old key keeps working (default 24 h, at most 7 days).",
    )


class ApiKeyListParams(ListParamsSerializer):
    principal_type = S.ChoiceField(choices=PRINCIPAL_TYPES, required=False)
    principal_id = S.RegexField(r"^(cus|mer|ter|stf)_[A-Za-z0-9]{1,40}$", max_length=48, required=False)


class FreezeIn(StrictSerializer):
    reason = strict_char(max_length=500)


class UnfreezeIn(StrictSerializer):
    reason = strict_char(max_length=500, required=False, allow_blank=True, default="")


class PendingAdjustmentRejectIn(StrictSerializer):
    reason = strict_char(max_length=500, required=False, allow_blank=True, default="")


# --- Money objects ---------------------------------------------------------------------


class PaymentOut(ObjectOut):
    object_type = "payment"
    status = S.CharField()
    asset = _ref("asset_id")
    amount = S.IntegerField()
    fee = S.IntegerField(help_text="The operator's fee, taken from the amount (its fee schedule in force at the payment's time).")
    net = S.IntegerField(help_text="What the merchant got: amount - fee.")
    amount_refunded = S.IntegerField()
    customer = _ref("customer_id")
    merchant = _ref("merchant_id")
    store = _ref("store_id", nullable=True)
    terminal = _ref("terminal_id", nullable=True)
    points_earned = S.IntegerField()
    carbon_grams = S.IntegerField()


class RefundOut(ObjectOut):
    object_type = "refund"
    status = S.CharField()
    payment = _ref("payment_id")
    asset = _ref("payment.asset_id")
    amount = S.IntegerField()
    fee = S.IntegerField(help_text="The payment's fee this refund gave back (from the operator); the merchant gave amount - fee.")
    reason = S.CharField()


class CustomerPaymentOut(PaymentOut):
    """A payment as its customer sees it: the operator's fee and the merchant's net are not the customer's business."""

    fee = None  # type: ignore[assignment]  # DRF: a field set to None is removed
    net = None  # type: ignore[assignment]


class CustomerRefundOut(RefundOut):
    """A refund as its customer sees it: without the fee the operator gave back to the merchant."""

    fee = None  # type: ignore[assignment]  # DRF: a field set to None is removed


class TransferOut(ObjectOut):
    object_type = "transfer"
    status = S.CharField()
    from_customer = _ref("from_customer_id")
    to_customer = _ref("to_customer_id")
    asset = _ref("asset_id")
    amount = S.IntegerField()


class MandateOut(ObjectOut):
    object_type = "mandate"
    customer = _ref("customer_id")
    merchant = _ref("merchant_id")
    revoked_at = S.DateTimeField(allow_null=True)


class TopUpOut(ObjectOut):
    object_type = "topup"
    status = S.CharField()
    customer = _ref("customer_id")
    asset = _ref("asset_id")
    amount = S.IntegerField()
    bonus_amount = S.IntegerField()
    payment_method = S.CharField()
    failure_code = S.CharField()


class PayoutOut(ObjectOut):
    object_type = "payout"
    status = S.ChoiceField(choices=["pending", "in_transit", "paid", "failed", "canceled"])
    merchant = _ref("merchant_id")
    asset = _ref("asset_id")
    amount = S.IntegerField()
    origin = S.ChoiceField(choices=["manual", "scheduled", "retry"])
    bank_account_last4 = S.CharField(source="destination_last4")
    awaiting_approval = S.BooleanField()
    arrival_date = S.DateTimeField(source="arrival_expected_at", allow_null=True)
    failure_code = S.CharField()


class AdjustmentOut(ObjectOut):
    object_type = "adjustment"
    staff = _ref("staff_id")
    customer = _ref("customer_id", nullable=True)
    merchant = _ref("merchant_id", nullable=True)
    asset = _ref("asset_id")
    amount = S.IntegerField()
    direction = S.CharField()
    reason = S.CharField()


class PendingAdjustmentOut(AdjustmentOut):
    """An adjustment waiting for a second staff member (maker-checker); once approved,
    `adjustment` names the posted one."""

    object = ConstField("pending_adjustment")
    staff = None  # type: ignore[assignment]  # DRF: a field set to None is removed; a held adjustment has a maker instead
    status = S.CharField()
    maker = _ref("maker_id")
    checker = _ref("checker_id", nullable=True)
    adjustment = _ref("adjustment_id", nullable=True)
    decided_at = S.DateTimeField(allow_null=True)


class PaymentIntentOut(ObjectOut):
    object_type = "payment_intent"
    status = S.CharField()
    merchant = _ref("merchant_id")
    customer = _ref("customer_id")
    asset = _ref("asset_id")
    amount = S.IntegerField()
    amount_captured = S.IntegerField()
    capture_method = S.CharField()
    payment = _ref("payment_id", nullable=True)
    fee = S.IntegerField(source="payment.fee", allow_null=True, help_text="The charge's fee (null until charged or captured).")
    net = S.IntegerField(source="payment.net", allow_null=True, help_text="What the merchant got: amount_captured - fee.")
    failure_code = S.CharField()


class FeeScheduleOut(ObjectOut):
    object_type = "fee_schedule"
    asset = _ref("asset_id")
    merchant = _ref("merchant_id", nullable=True)
    rate = S.DecimalField(max_digits=FEE_RATE_PLACES + 1, decimal_places=FEE_RATE_PLACES)
    rounding = S.CharField()
    fixed = S.IntegerField()
    valid_from = S.DateTimeField()


AT_NULL = " Null with `at`: holds and the settlement window are not kept per instant."


class BalanceAtField(InstantFilterField):
    """`at`: the instant a balance is asked as of. It must carry its offset or zone (a wall
    clock alone names no instant) and must not be in the future (no balance is known yet)."""

    default_error_messages = {
        "naive": "must carry a UTC offset or Z (e.g. 2026-11-30T23:59:59+09:00): a date and time alone name no instant",
        "future": "must not be in the future",
    }

    def enforce_timezone(self, value: datetime) -> datetime:
        if value.tzinfo is None or value.utcoffset() is None:
            self.fail("naive")
        return super().enforce_timezone(value)

    def to_internal_value(self, value: Any) -> datetime:
        instant = super().to_internal_value(value)
        if instant > datetime.now(UTC):
            self.fail("future")
        return instant


AT_HELP = ("An ISO 8601 instant with its offset (e.g. 2026-11-30T23:59:59+09:00 or ...Z), not in the future: each asset's `balance`"
           " as of that instant (the ledger's entries created at or before it), whose other amounts are null. Before the account"
           " existed every balance is 0.")


class BalanceAtParams(StrictSerializer):
    at = BalanceAtField(required=False, help_text=AT_HELP)


class BalanceOut(Serializer):
    asset = S.CharField()
    balance = S.IntegerField()
    available = S.IntegerField(allow_null=True, help_text="balance - held." + AT_NULL)
    held = S.IntegerField(allow_null=True, help_text="Held by authorizations." + AT_NULL)


class WalletOut(Serializer):
    object = ConstField("wallet")
    customer = S.CharField()
    frozen = S.BooleanField()
    at = S.DateTimeField(allow_null=True, help_text="The instant asked with `at` (UTC), else null (balances now).")
    balances = BalanceOut(many=True)


class MerchantBalanceLineOut(Serializer):
    asset = S.CharField()
    balance = S.IntegerField()
    available = S.IntegerField(allow_null=True, help_text="What may be paid out now: balance - held - pending." + AT_NULL)
    pending = S.IntegerField(allow_null=True,
                             help_text="Credits younger than the settlement delay (a credit on UTC day D is available from 00:00 UTC of"
                             " D + delay + 1; a failed or canceled payout's money coming back is available at once), less what debits"
                             " took beyond available." + AT_NULL)
    held = S.IntegerField(allow_null=True, help_text=AT_NULL.strip())


class MerchantBalanceOut(Serializer):
    object = ConstField("balance")
    merchant = S.CharField()
    at = S.DateTimeField(allow_null=True, help_text="The instant asked with `at` (UTC), else null (balances now).")
    balances = MerchantBalanceLineOut(many=True)


class AccountBalanceAtOut(Serializer):
    asset = S.CharField()
    balance = S.IntegerField()


class PartyBalancesAtOut(Serializer):
    """A customer's or merchant's balance per asset as of an instant, from the ledger."""

    object = ConstField("balances_at")
    account = S.CharField()
    at = S.DateTimeField(help_text="The instant (UTC): `at` as asked, else the moment of the answer.")
    balances = AccountBalanceAtOut(many=True)


class DailyTotalOut(Serializer):
    """A merchant's day (UTC) in one asset: what was credited and debited, net, entries."""

    object = ConstField("merchant_daily_total")
    day = S.DateField()
    asset = S.CharField()
    credited = S.IntegerField()
    debited = S.IntegerField()
    net = S.IntegerField()
    entries = S.IntegerField()


# The days a balance history takes: years 1970 to 9000 (no date arithmetic overflows).
DAY_PATTERN = r"^(19[7-9][0-9]|[2-8][0-9]{3}|9000)-[0-9]{2}-[0-9]{2}$"
HISTORY_PAGE_DAYS = 366


@extend_schema_field({"type": "string", "format": "date", "pattern": DAY_PATTERN})
class DayField(S.DateField):
    def to_internal_value(self, value: Any) -> Any:
        day = super().to_internal_value(value)
        if not 1970 <= day.year <= 9000:
            raise S.ValidationError("must be a day between the years 1970 and 9000")
        return day


class BalanceHistoryParams(StrictSerializer):
    asset = AssetFilterField(required=False)
    day_from = DayField(required=False, help_text="First UTC day (default: 30 days before day_to); after day_to, the list is empty.")
    day_to = DayField(required=False, help_text="Last UTC day, inclusive (default: today).")
    cursor = DayField(
        required=False,
        help_text=f"Opaque: the `next_cursor` of the previous page, sent with the same day_from and day_to. A page covers at most "
        f"{HISTORY_PAGE_DAYS} days, newest first; `next_cursor` is set when older days remain.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        day_to = attrs.get("day_to") or datetime.now(UTC).date()
        day_from = attrs.get("day_from") or day_to - timedelta(days=30)
        page_to = min(day_to, attrs["cursor"]) if attrs.get("cursor") else day_to
        page_from = max(day_from, page_to - timedelta(days=HISTORY_PAGE_DAYS - 1))
        next_cursor = (page_from - timedelta(days=1)).isoformat() if page_from > day_from else None
        return {**attrs, "day_from": page_from, "day_to": page_to, "next_cursor": next_cursor}


class TransactionOut(Serializer):
    """One line of a wallet's history: a ledger entry on the customer's account."""

    id = _ref("transaction_id")
    object = ConstField("transaction")
    created = S.DateTimeField()
    type = _ref("transaction.kind")
    reference = _ref("transaction.reference")
    asset = _ref("asset_id")
    amount = S.IntegerField(help_text="Signed: positive credits the wallet, negative debits it.")


class PaymentTokenOut(Serializer):
    object = ConstField("payment_token")
    token = S.CharField(help_text="Show it as a QR code; single customer, short-lived.")
    expires_at = S.DateTimeField()


# --- Money requests --------------------------------------------------------------------


class TransferCreateIn(StrictSerializer):
    to_customer = ObjectIdField("cus")
    asset = AssetField()
    amount = AmountField()


class MandateCreateIn(StrictSerializer):
    merchant = ObjectIdField("mer")


class TopUpCreateIn(StrictSerializer):
    asset = AssetField(kinds=("currency", "regional"), help_text="A currency asset: the main or a regional currency (not points or carbon).")
    amount = AmountField()
    payment_method = S.RegexField(r"^[A-Za-z0-9_\-]{1,100}$", max_length=100, help_text="PSP payment method id, e.g. pm_card_visa.")


class TerminalPaymentCreateIn(StrictSerializer):
    exactly_one_of = ("customer_token", "customer")
    customer_token = S.RegexField(r"^[A-Za-z0-9_\-]{8,128}$", max_length=128, required=False)
    customer = ObjectIdField("cus", required=False)
    asset = AssetField()
    amount = AmountField()

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if bool(attrs.get("customer_token")) == bool(attrs.get("customer")):
            raise S.ValidationError({"customer_token": [S.ErrorDetail("give exactly one of customer_token or customer", code="invalid")]})
        return attrs


class RefundCreateIn(StrictSerializer):
    payment = ObjectIdField("pay")
    amount = AmountField()
    reason = strict_char(max_length=500, required=False, allow_blank=True, default="")


class PayoutCreateIn(StrictSerializer):
    asset = AssetField()
    amount = AmountField()


class PayoutListParams(ListParamsSerializer):
    asset = AssetFilterField(required=False)
    status = S.ChoiceField(choices=["pending", "in_transit", "paid", "failed", "canceled"], required=False)


class AdjustmentCreateIn(StrictSerializer):
    exactly_one_of = ("customer", "merchant")
    customer = ObjectIdField("cus", required=False)
    merchant = ObjectIdField("mer", required=False)
    asset = AssetField()
    amount = AmountField()
    direction = S.ChoiceField(choices=["credit", "debit"])
    reason = strict_char(max_length=500)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if bool(attrs.get("customer")) == bool(attrs.get("merchant")):
            raise S.ValidationError({"customer": [S.ErrorDetail("give exactly one of customer or merchant", code="invalid")]})
        return attrs


class PaymentIntentCreateIn(StrictSerializer):
    customer = ObjectIdField("cus")
    asset = AssetField()
    amount = AmountField()
    capture_method = S.ChoiceField(choices=["automatic", "manual"], required=False, default="automatic")


class PaymentIntentUpdateIn(StrictSerializer):
    amount = AmountField()


class PaymentIntentCaptureIn(StrictSerializer):
    amount_to_capture = AmountField(required=False, help_text="Defaults to the full authorized amount; the rest is released.")


class RateField(S.RegexField):
    """A fraction from 0 to 1 written as a string ("0.029"; a JSON number is a float on the way in)."""

    def __init__(self, **kwargs: Any) -> None:
        pattern = rf"^(0(\.[0-9]{{1,{FEE_RATE_PLACES}}})?|1(\.0{{1,{FEE_RATE_PLACES}}})?)$"
        message = f"must be a decimal string from 0 to 1 with at most {FEE_RATE_PLACES} places, e.g. \"0.029\""
        super().__init__(pattern, max_length=FEE_RATE_PLACES + 2, error_messages={"invalid": message}, **kwargs)

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):  # DRF's CharField would take 0.029 as "0.029"; a float is not a rate
            raise S.ValidationError(
                f"must be a JSON string, not a number: a decimal from 0 to 1 with at most {FEE_RATE_PLACES} places, e.g. \"0.029\""
            )
        return super().to_internal_value(data)

    def run_validation(self, data: Any = S.empty) -> Any:  # a Decimal, once the text passed the pattern and length
        return Decimal(super().run_validation(data))


class MinorUnitsField(S.IntegerField):
    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, bool) or not isinstance(data, int):  # DRF would take "5" and 5.0
            raise S.ValidationError("must be an integer in the asset's minor unit")
        return super().to_internal_value(data)


class FeeScheduleCreateIn(StrictSerializer):
    asset = AssetField()
    merchant = ObjectIdField("mer", required=False, allow_null=True, default=None, help_text="A merchant's own schedule; none: tenant-wide.")
    rate = RateField(help_text="Fraction of the amount, 0 to 1, as a JSON string (\"0.029\" is 2.9 %; a number is refused).")
    rounding = S.ChoiceField(choices=FeeRounding.values, required=False, default=FeeRounding.HALF_EVEN,
                             help_text="How amount x rate is rounded to a minor unit (Python's decimal modes).")
    fixed = MinorUnitsField(min_value=0, max_value=MAX_AMOUNT, required=False, default=0, help_text="Added to every fee, in minor units.")
    valid_from = InstantFilterField(
        required=False, allow_null=True, default=None,
        help_text="When it starts applying to payments: at least 15 s from now by default (every process must know it first;"
        " TALLY_FEE_SCHEDULE_CACHE_SECONDS + TALLY_FEE_SCHEDULE_GRACE_SECONDS); omitted: that earliest start.",
    )


class EmptyIn(StrictSerializer):
    """Actions that take no parameters still refuse unknown ones."""


# --- List query parameters -------------------------------------------------------------


class PendingAdjustmentListParams(ListParamsSerializer):
    status = S.ChoiceField(choices=["pending", "approved", "rejected"], required=False)


class CustomerListParams(ListParamsSerializer):
    email = S.EmailField(required=False, max_length=254, help_text="Only customers with this email (case-insensitive).")


class AssetListParams(ListParamsSerializer):  # payments and wallet history
    asset = AssetFilterField(required=False)


# --- Lists (documented shapes) ---------------------------------------------------------

DailyTotalList = list_serializer(DailyTotalOut, "DailyTotalList")
TopUpList = list_serializer(TopUpOut, "TopUpList")
