"""Payment objects and the outbox. Every row that moves money points at the
LedgerTransaction that moved it. Amounts are integers in the asset's minor unit; CHECK
constraints are the last line of defence (the services check first).

A foreign key has no index of its own (db_index=False) where no query looks rows up by it
and nothing deletes its target, or where a composite index leads with it: each index is a
relation in every tenant (the budget in tests/test_tenant_schemas.py)."""

from __future__ import annotations

import decimal
import hashlib

from django.db import models
from django.db.models import F, Q
from django.db.models.fields.json import KT
from django.utils import timezone

from wallets import ids
from wallets.abstract import PrefixedIdModel
from wallets.models import Asset, Customer, Hold, LedgerTransaction, Merchant, StaffMember, Store, Terminal


def new_payment_token_id() -> str:
    return ids.new_id("ptk")


PAYMENT_TOKEN_PREFIX = "ptok_"  # noqa: S105 - a prefix, not a secret
PAYMENT_TOKEN_MAX_LENGTH = 100


def payment_token_hash(raw: str) -> str:
    """What a payment token is stored and found as: its SHA-256."""
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def payment_token_is_well_formed(token: object) -> bool:
    return isinstance(token, str) and token.startswith(PAYMENT_TOKEN_PREFIX) and len(token) <= PAYMENT_TOKEN_MAX_LENGTH


class PaymentStatus(models.TextChoices):
    SUCCEEDED = "succeeded", "Succeeded"


class Payment(PrefixedIdModel, new_id=ids.new_payment_id):
    """A customer paying a merchant (at a terminal, or through a payment intent)."""

    status = models.CharField(max_length=12, choices=PaymentStatus.choices, default=PaymentStatus.SUCCEEDED)
    # No database foreign keys (see LedgerEntry): a KEY SHARE lock per payment on a shared
    # hot row (merchant, store, terminal, asset) costs a MultiXact each. The charge resolves
    # every referenced row before it inserts; the reconciliation checks them.
    customer = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="payments", db_constraint=False, db_index=False)
    merchant = models.ForeignKey(Merchant, on_delete=models.PROTECT, related_name="payments", db_constraint=False, db_index=False)
    store = models.ForeignKey(
        Store, null=True, blank=True, on_delete=models.PROTECT, related_name="payments", db_constraint=False, db_index=False
    )
    terminal = models.ForeignKey(
        Terminal, null=True, blank=True, on_delete=models.PROTECT, related_name="payments", db_constraint=False, db_index=False
    )
    asset = models.ForeignKey(Asset, on_delete=models.PROTECT, related_name="+", db_constraint=False, db_index=False)
    amount = models.BigIntegerField()
    amount_refunded = models.BigIntegerField(default=0)
    # Rewards earned by this payment and how much of them refunds have taken back.
    points_earned = models.BigIntegerField(default=0)
    points_reversed = models.BigIntegerField(default=0)
    carbon_grams = models.BigIntegerField(default=0)
    carbon_grams_reversed = models.BigIntegerField(default=0)
    # The operator's fee, in the asset, taken in the payment's own ledger transaction (the
    # merchant gets `net`), and how much of it refunds gave back. db_default: older code inserts.
    fee = models.BigIntegerField(default=0, db_default=0)
    fee_refunded = models.BigIntegerField(default=0, db_default=0)
    ledger_transaction = models.ForeignKey(LedgerTransaction, on_delete=models.PROTECT, related_name="+", db_constraint=False, db_index=False)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created", "-id"]
        permissions = [("refund_payment", "Can refund a payment from the back office")]
        indexes = [
            # The admin's list order (newest first) and date filters, without a sort of the table.
            models.Index(fields=["-created", "-id"], name="payment_created"),
            models.Index(fields=["merchant", "-created", "-id"], name="payment_merchant_created"),
            models.Index(fields=["store", "-created", "-id"], name="payment_store_created"),
            models.Index(fields=["customer", "-created", "-id"], name="payment_customer_created"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="payment_amount_positive"),
            models.CheckConstraint(condition=Q(amount_refunded__gte=0, amount_refunded__lte=F("amount")), name="payment_refunded_bounded"),
            models.CheckConstraint(condition=Q(points_reversed__gte=0, points_reversed__lte=F("points_earned")), name="payment_points_bounded"),
            models.CheckConstraint(
                condition=Q(carbon_grams_reversed__gte=0, carbon_grams_reversed__lte=F("carbon_grams")), name="payment_carbon_bounded"
            ),
            models.CheckConstraint(condition=Q(fee__gte=0, fee__lte=F("amount")), name="payment_fee_bounded"),
            models.CheckConstraint(condition=Q(fee_refunded__gte=0, fee_refunded__lte=F("fee")), name="payment_fee_refunded_bounded"),
        ]

    @property
    def amount_refundable(self) -> int:
        return self.amount - self.amount_refunded

    @property
    def net(self) -> int:
        """What the merchant got: the amount less the fee."""
        return self.amount - self.fee

    def __str__(self) -> str:
        return f"{self.id} {self.amount} {self.asset_id}"


class Refund(PrefixedIdModel, new_id=ids.new_refund_id):
    status = models.CharField(max_length=12, default="succeeded")
    payment = models.ForeignKey(Payment, on_delete=models.PROTECT, related_name="refunds")
    amount = models.BigIntegerField()
    reason = models.CharField(max_length=500, blank=True, default="")
    points_reversed = models.BigIntegerField(default=0)
    carbon_grams_reversed = models.BigIntegerField(default=0)
    fee = models.BigIntegerField(default=0, db_default=0)  # the payment's fee this refund gave back (the tenant's policy)
    ledger_transaction = models.ForeignKey(LedgerTransaction, on_delete=models.PROTECT, related_name="+", db_index=False)

    class Meta:
        ordering = ["-created", "-id"]
        indexes = [models.Index(fields=["-created", "-id"], name="refund_created")]  # the admin's list order
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="refund_amount_positive"),
            models.CheckConstraint(condition=Q(fee__gte=0, fee__lte=F("amount")), name="refund_fee_bounded"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.amount} of {self.payment_id}"


class Transfer(PrefixedIdModel, new_id=ids.new_transfer_id):
    status = models.CharField(max_length=12, default="succeeded")
    from_customer = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="transfers_out")
    to_customer = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="transfers_in")
    asset = models.ForeignKey(Asset, on_delete=models.PROTECT, related_name="+", db_index=False)
    amount = models.BigIntegerField()
    ledger_transaction = models.ForeignKey(LedgerTransaction, on_delete=models.PROTECT, related_name="+", db_index=False)

    class Meta:
        ordering = ["-created", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="transfer_amount_positive"),
            models.CheckConstraint(condition=~Q(from_customer=F("to_customer")), name="transfer_not_to_self"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.amount} {self.asset_id}"


class TopUpStatus(models.TextChoices):
    PENDING = "pending", "Pending (waiting for the PSP)"
    SUCCEEDED = "succeeded", "Succeeded (credited)"
    FAILED = "failed", "Failed"


class TopUp(PrefixedIdModel, new_id=ids.new_topup_id):
    """Money entering a wallet from a card (PSP funding), plus the tenant's top-up bonus."""

    status = models.CharField(max_length=10, choices=TopUpStatus.choices, default=TopUpStatus.PENDING)
    customer = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="topups")
    asset = models.ForeignKey(Asset, on_delete=models.PROTECT, related_name="+", db_index=False)
    amount = models.BigIntegerField()
    bonus_amount = models.BigIntegerField(default=0)
    payment_method = models.CharField(max_length=100)
    psp_reference = models.CharField(max_length=200, blank=True, default="")
    failure_code = models.CharField(max_length=50, blank=True, default="")
    ledger_transaction = models.ForeignKey(LedgerTransaction, null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False)
    # The card saga: the gateway, the idempotency record that owns it (for the recovery),
    # when the PSP charged (its settlement day), the PSP refund of an uncredited charge.
    gateway = models.CharField(max_length=20, blank=True, default="")
    claim_principal_id = models.CharField(max_length=64, blank=True, default="")
    claim_key = models.CharField(max_length=255, blank=True, default="")
    psp_charged_at = models.DateTimeField(null=True, blank=True)
    psp_refund_reference = models.CharField(max_length=200, blank=True, default="")
    # The PSP holds a successful charge for this top-up. A declined charge has a reference
    # too, so the reference alone cannot say whether there is money to credit or give back.
    psp_charged = models.BooleanField(default=False)
    # What the PSP says it charged (on a failed top-up, matching or not): what a card refund
    # gives back, never what we asked for. Empty on older rows (the refund asks the PSP).
    psp_charged_amount = models.BigIntegerField(null=True, blank=True)
    psp_charged_currency = models.CharField(max_length=Asset._meta.get_field("code").max_length, blank=True, default="", db_default="")
    # Past the PSP's idempotency-key window (asking again could charge twice): an operator's.
    operator_review_at = models.DateTimeField(null=True, blank=True)
    # What the last attempt to settle it ran into: the operator's evidence.
    last_error = models.CharField(max_length=500, blank=True, default="")
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "top-up"
        verbose_name_plural = "top-ups"
        ordering = ["-created", "-id"]
        permissions = [("settle_topup", "Can settle a card top-up waiting for an operator")]
        indexes = [
            models.Index(fields=["created"], name="topup_pending_created", condition=Q(status="pending")),
            # The card refunds still owed (recovery, every run) and the reconciliation's check of them.
            models.Index(
                fields=["created", "id"], name="topup_charged_uncredited", condition=Q(status="failed", psp_charged=True, psp_refund_reference="")
            ),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="topup_amount_positive"),
            models.CheckConstraint(condition=Q(bonus_amount__gte=0), name="topup_bonus_non_negative"),
            models.CheckConstraint(
                condition=Q(status="succeeded", ledger_transaction__isnull=False) | ~Q(status="succeeded"), name="topup_succeeded_has_ledger"
            ),
            models.CheckConstraint(condition=Q(psp_charged=False) | ~Q(psp_reference=""), name="topup_charged_has_reference"),
            # One PSP charge credits at most one top-up, whoever records it.
            models.UniqueConstraint(fields=["psp_reference"], condition=~Q(psp_reference=""), name="topup_psp_reference_once"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.amount} {self.asset_id} ({self.status})"


FEE_RATE_PLACES = 6


def new_fee_schedule_id() -> str:
    return ids.new_id("fee")


class FeeRounding(models.TextChoices):
    """How `amount x rate` is rounded to a minor unit: the decimal module's modes, by name."""

    HALF_EVEN = decimal.ROUND_HALF_EVEN, "Half to even (banker's)"
    HALF_UP = decimal.ROUND_HALF_UP, "Half up"
    HALF_DOWN = decimal.ROUND_HALF_DOWN, "Half down"
    UP = decimal.ROUND_UP, "Away from zero"
    DOWN = decimal.ROUND_DOWN, "Toward zero"
    CEILING = decimal.ROUND_CEILING, "Ceiling"
    FLOOR = decimal.ROUND_FLOOR, "Floor"


class FeeSchedule(PrefixedIdModel, new_id=new_fee_schedule_id):
    """The operator's fee on payments in one asset: tenant-wide, or one merchant's own
    (which beats the tenant-wide one), from `valid_from` on. Never edited: a change is a new
    schedule with a later `valid_from` (payments.services.fees), so a payment's fee is the
    one in force at its time. fee = min(amount, amount x rate rounded by `rounding` + fixed)."""

    asset = models.ForeignKey(Asset, on_delete=models.PROTECT, related_name="+")
    merchant = models.ForeignKey(Merchant, null=True, blank=True, on_delete=models.PROTECT, related_name="fee_schedules")
    rate = models.DecimalField(max_digits=FEE_RATE_PLACES + 1, decimal_places=FEE_RATE_PLACES)
    rounding = models.CharField(max_length=16, choices=FeeRounding.choices, default=FeeRounding.HALF_EVEN)
    fixed = models.BigIntegerField(default=0)  # minor units
    valid_from = models.DateTimeField()

    class Meta:
        ordering = ["-valid_from", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(rate__gte=0, rate__lte=1), name="fee_schedule_rate_bounded"),
            models.CheckConstraint(condition=Q(fixed__gte=0), name="fee_schedule_fixed_non_negative"),
            # Also the index of the charge's lookup (asset, then the merchant's or the tenant-wide rows).
            models.UniqueConstraint(fields=["asset", "merchant", "valid_from"], nulls_distinct=False, name="fee_schedule_one_start"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.asset_id} {self.merchant_id or 'tenant-wide'} from {self.valid_from:%Y-%m-%d %H:%M}"


def new_pending_adjustment_id() -> str:
    return ids.new_id("padj")


class AdjustmentDirection(models.TextChoices):
    CREDIT = "credit", "Credit"
    DEBIT = "debit", "Debit"


class Adjustment(PrefixedIdModel, new_id=ids.new_adjustment_id):
    """A staff correction with a reason, against the adjustments system account."""

    staff = models.ForeignKey(StaffMember, on_delete=models.PROTECT, related_name="adjustments", db_index=False)
    customer = models.ForeignKey(Customer, null=True, blank=True, on_delete=models.PROTECT, related_name="adjustments")
    merchant = models.ForeignKey(Merchant, null=True, blank=True, on_delete=models.PROTECT, related_name="adjustments")
    asset = models.ForeignKey(Asset, on_delete=models.PROTECT, related_name="+", db_index=False)
    amount = models.BigIntegerField()
    direction = models.CharField(max_length=6, choices=AdjustmentDirection.choices)
    reason = models.CharField(max_length=500)
    ledger_transaction = models.ForeignKey(LedgerTransaction, on_delete=models.PROTECT, related_name="+", db_index=False)

    class Meta:
        ordering = ["-created", "-id"]
        # The maker-checker's sum of what one staff member posted in one asset within the
        # window (payments.selectors.staff_solo_postings_total), read at every posting.
        indexes = [models.Index(fields=["staff", "asset", "created"], name="adjustment_staff_asset_created")]
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="adjustment_amount_positive"),
            models.CheckConstraint(
                condition=Q(customer__isnull=False, merchant__isnull=True) | Q(customer__isnull=True, merchant__isnull=False),
                name="adjustment_one_party",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.direction} {self.amount} {self.asset_id}"


class CaptureMethod(models.TextChoices):
    AUTOMATIC = "automatic", "Automatic"
    MANUAL = "manual", "Manual"


class PaymentIntentStatus(models.TextChoices):
    CREATED = "created", "Created"
    CHARGE_REQUESTED = "charge_requested", "Charge requested"
    CHARGED = "charged", "Charged"
    CHARGE_FAILED = "charge_failed", "Charge failed"
    AUTHORIZED = "authorized", "Authorized (funds held)"
    CAPTURED = "captured", "Captured"
    CANCELED = "canceled", "Canceled"


class PaymentIntent(PrefixedIdModel, new_id=ids.new_payment_intent_id):
    """A merchant-initiated charge (SPEC 7). Every transition is a compare-and-set on `version`."""

    merchant = models.ForeignKey(Merchant, on_delete=models.PROTECT, related_name="payment_intents", db_index=False)
    customer = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="payment_intents")
    asset = models.ForeignKey(Asset, on_delete=models.PROTECT, related_name="+", db_index=False)
    amount = models.BigIntegerField()
    amount_captured = models.BigIntegerField(default=0)
    capture_method = models.CharField(max_length=10, choices=CaptureMethod.choices, default=CaptureMethod.AUTOMATIC)
    status = models.CharField(max_length=20, choices=PaymentIntentStatus.choices, default=PaymentIntentStatus.CREATED)
    version = models.PositiveIntegerField(default=1)
    hold = models.OneToOneField(Hold, null=True, blank=True, on_delete=models.PROTECT, related_name="payment_intent")
    payment = models.OneToOneField(Payment, null=True, blank=True, on_delete=models.PROTECT, related_name="payment_intent")
    failure_code = models.CharField(max_length=50, blank=True, default="")
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created", "-id"]
        indexes = [models.Index(fields=["merchant", "-created", "-id"], name="intent_merchant_created")]
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="intent_amount_positive"),
            models.CheckConstraint(condition=Q(amount_captured__gte=0, amount_captured__lte=F("amount")), name="intent_captured_bounded"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.amount} {self.asset_id} ({self.status} v{self.version})"


class PaymentToken(PrefixedIdModel, new_id=new_payment_token_id):
    """A short-lived, single-use token for a terminal's QR scan; only its SHA-256 is stored.
    The payment that consumes it sets `used_at` in its own transaction."""

    customer = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="payment_tokens")
    token_hash = models.CharField(max_length=64, unique=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.id} ({self.customer_id})"


class OutboxEvent(PrefixedIdModel, new_id=ids.new_event_id):
    """An event committed with the movement it describes; a relay publishes it at least once."""

    topic = models.CharField(max_length=100)
    payload = models.JSONField()
    created = models.DateTimeField(default=timezone.now)
    # The object the event is about (`payload["id"]`), and the event's place among that
    # object's events (1, 2, 3...; 0: none): receivers order an object's events by it.
    # db_default: code from before these columns keeps inserting during a rolling deploy.
    object_id = models.CharField(max_length=ids.ID_MAX_LENGTH, blank=True, default="", db_default="")
    sequence = models.PositiveIntegerField(default=0, db_default=0)
    published_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    # After a failed publication the relay skips the row until `next_attempt_at`; after
    # a bounded number of attempts it sets `dead_at` (visible in the admin, requeueable).
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    dead_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created", "id"]
        permissions = [("requeue_outboxevent", "Can requeue an outbox event or dead letter")]
        # The relay's claim, its watermark and the lag gauge ask for the oldest live
        # unpublished rows: with `dead_at` in the predicate they read this index in order
        # and stop at the first row (with `published_at` alone the planner took a bitmap
        # scan that visited every dead entry until VACUUM). Dead letters have their own index.
        indexes = [
            models.Index(
                fields=["created", "id"], condition=Q(published_at__isnull=True, dead_at__isnull=True), name="outbox_live_unpublished"
            ),
            models.Index(
                fields=["dead_at", "id"], condition=Q(published_at__isnull=True, dead_at__isnull=False), name="outbox_dead_letters"
            ),
            # The next sequence of an object: its last event, one index probe.
            models.Index(fields=["object_id", "-sequence"], condition=~Q(object_id=""), name="outbox_object_sequence"),
            # A merchant's events, newest first (GET /v1/merchant/events, webhooks.selectors).
            models.Index(KT("payload__merchant"), F("created").desc(), F("id").desc(), name="outbox_merchant_created"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.topic}"


def new_mandate_id() -> str:
    return ids.new_id("mnd")


class Mandate(PrefixedIdModel, new_id=new_mandate_id):
    """A customer's standing consent that one merchant (its terminals and intents) may charge
    them by customer id; revocable from the customer face (SPEC 4)."""

    customer = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="mandates")
    merchant = models.ForeignKey(Merchant, on_delete=models.PROTECT, related_name="mandates")
    created = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["customer", "merchant"], condition=Q(revoked_at__isnull=True), name="mandate_one_active"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.customer_id} -> {self.merchant_id}{' (revoked)' if self.revoked_at else ''}"


class PendingAdjustmentStatus(models.TextChoices):
    PENDING = "pending", "Pending approval"
    APPROVED = "approved", "Approved (posted)"
    REJECTED = "rejected", "Rejected"


class PendingAdjustment(PrefixedIdModel, new_id=new_pending_adjustment_id):
    """An adjustment above the tenant's approval threshold (maker-checker): proposed by one
    staff member, posted only when a different one approves it (payments.services.approvals)."""

    maker = models.ForeignKey(StaffMember, on_delete=models.PROTECT, related_name="adjustments_proposed")
    checker = models.ForeignKey(StaffMember, null=True, blank=True, on_delete=models.PROTECT, related_name="adjustments_checked", db_index=False)
    customer = models.ForeignKey(Customer, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    merchant = models.ForeignKey(Merchant, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    asset = models.ForeignKey(Asset, on_delete=models.PROTECT, related_name="+")
    amount = models.BigIntegerField()
    direction = models.CharField(max_length=6, choices=AdjustmentDirection.choices)
    reason = models.CharField(max_length=500)
    status = models.CharField(max_length=10, choices=PendingAdjustmentStatus.choices, default=PendingAdjustmentStatus.PENDING)
    adjustment = models.OneToOneField(Adjustment, null=True, blank=True, on_delete=models.PROTECT, related_name="approval")
    created = models.DateTimeField(default=timezone.now)
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]
        permissions = [("approve_pendingadjustment", "Can approve or reject another staff member's adjustment")]
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="pending_adjustment_amount_positive"),
            models.CheckConstraint(condition=Q(checker__isnull=True) | ~Q(checker=F("maker")), name="pending_adjustment_checker_not_maker"),
            models.CheckConstraint(
                condition=Q(status="approved", adjustment__isnull=False) | ~Q(status="approved"), name="pending_adjustment_approved_posted"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.direction} {self.amount} {self.asset_id} ({self.status})"


class Gateway(models.TextChoices):
    SIMULATOR = "simulator", "PSP simulator (development and tests)"
    STRIPE = "stripe", "Stripe (production)"


class GatewayAccount(models.Model):
    """The tenant's account at a PSP: which gateway card top-ups use (the one `active`
    row), and its credentials, sealed at rest (payments/gateways/credentials.py)."""

    gateway = models.CharField(max_length=20, choices=Gateway.choices, unique=True)
    active = models.BooleanField(default=False)
    api_base = models.URLField(max_length=300, help_text="The PSP's API root (the simulator's URL; Stripe's default).")
    secret_key_sealed = models.BinaryField()
    # A JSON list of webhook signing secrets, all valid at once (rotation), sealed.
    webhook_secrets_sealed = models.BinaryField()
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "PSP gateway account"
        verbose_name_plural = "PSP gateway accounts"
        constraints = [models.UniqueConstraint(fields=["active"], condition=Q(active=True), name="gateway_account_one_active")]

    def __str__(self) -> str:
        return f"{self.gateway}{' (active)' if self.active else ''}"


class PspWebhookEvent(models.Model):
    """An inbound PSP event, recorded in the same transaction as its effect: the unique
    (gateway, event_id) makes a redelivery a no-op; a failed handler records nothing."""

    gateway = models.CharField(max_length=20)
    event_id = models.CharField(max_length=255)
    type = models.CharField(max_length=100)
    outcome = models.CharField(max_length=20)  # applied, ignored
    received = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "PSP webhook event"
        verbose_name_plural = "PSP webhook events"
        ordering = ["-received", "-id"]
        constraints = [models.UniqueConstraint(fields=["gateway", "event_id"], name="psp_webhook_event_unique")]

    def __str__(self) -> str:
        return f"{self.gateway}/{self.event_id} {self.type}"


class MerchantBankAccount(models.Model):
    """Where a merchant's payouts go: a bank account held at the PSP. Tally keeps the PSP's
    reference and the last four digits, never the account number. Attached or changed by
    staff, audited (payments.services.payouts.bank_account_attach)."""

    merchant = models.OneToOneField(Merchant, on_delete=models.PROTECT, primary_key=True, related_name="bank_account")
    gateway = models.CharField(max_length=20, choices=Gateway.choices)
    psp_reference = models.CharField(max_length=200)
    last4 = models.CharField(max_length=4)
    # A payout to an account changed in the last 7 days waits for a staff member's approval.
    changed_at = models.DateTimeField(default=timezone.now)
    # Who attached or changed it: a payout the change makes wait is theirs to propose, never to approve.
    changed_by = models.ForeignKey(StaffMember, null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False)

    class Meta:
        permissions = [("attach_bank_account", "Can attach or change a merchant's bank account")]

    def __str__(self) -> str:
        return f"{self.merchant_id}: •••• {self.last4} ({self.gateway})"


def new_payout_id() -> str:
    return ids.new_id("po")


class PayoutStatus(models.TextChoices):
    PENDING = "pending", "Pending (not at the PSP yet)"
    IN_TRANSIT = "in_transit", "In transit (the PSP has it)"
    PAID = "paid", "Paid"
    FAILED = "failed", "Failed (the funds are back with the merchant)"
    CANCELED = "canceled", "Canceled (the funds are back with the merchant)"


class PayoutOrigin(models.TextChoices):
    MANUAL = "manual", "Manual (the merchant's request)"
    SCHEDULED = "scheduled", "Scheduled"
    RETRY = "retry", "Retry of a failed payout (staff)"


def _any_of(field: str, values: list[str]) -> Q:
    any_of = Q()
    for value in values:
        any_of |= Q(**{field: value})
    return any_of


class Payout(PrefixedIdModel, new_id=new_payout_id):
    """Money leaving a merchant for its bank account through the PSP (payments.services.payouts):
    moved to payouts in transit when made, to the PSP's settlement account when paid, back to
    the merchant when failed or canceled, each once, in its own ledger transaction."""

    merchant = models.ForeignKey(Merchant, on_delete=models.PROTECT, related_name="payouts", db_index=False)
    asset = models.ForeignKey(Asset, on_delete=models.PROTECT, related_name="+", db_index=False)
    amount = models.BigIntegerField()
    status = models.CharField(max_length=10, choices=PayoutStatus.choices, default=PayoutStatus.PENDING)
    origin = models.CharField(max_length=10, choices=PayoutOrigin.choices, default=PayoutOrigin.MANUAL)
    schedule_day = models.DateField(null=True, blank=True)  # a scheduled payout's UTC day: one per merchant, asset and day
    retry_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="retries")
    # The bank account it goes to, as it was when the payout was made.
    gateway = models.CharField(max_length=20, choices=Gateway.choices)
    destination = models.CharField(max_length=200)
    destination_last4 = models.CharField(max_length=4)
    # Maker-checker: a payout above the asset's threshold, or to a bank account changed in the
    # last 7 days, is sent only once a staff member approves it (alone within their solo
    # limit, else a second one: `approval_maker` is the first).
    approval_required = models.BooleanField(default=False)
    approval_reason = models.CharField(max_length=200, blank=True, default="")
    approval_maker = models.ForeignKey(StaffMember, null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False)
    approved_by = models.ForeignKey(StaffMember, null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False)
    approved_at = models.DateTimeField(null=True, blank=True)
    # The saga: who may complete a PSP call (fence) and until when (lease); `attempts` > 0
    # means the PSP may have it, so it can no longer be canceled.
    fence = models.PositiveIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.CharField(max_length=500, blank=True, default="")
    psp_reference = models.CharField(max_length=200, blank=True, default="")
    psp_created_at = models.DateTimeField(null=True, blank=True)
    arrival_expected_at = models.DateTimeField(null=True, blank=True)  # the PSP's promise
    psp_checked_at = models.DateTimeField(null=True, blank=True)  # the recovery last asked the PSP about it
    failure_code = models.CharField(max_length=50, blank=True, default="")
    ledger_transaction = models.ForeignKey(LedgerTransaction, on_delete=models.PROTECT, related_name="+", db_index=False)
    paid_transaction = models.ForeignKey(LedgerTransaction, null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False)
    returned_transaction = models.ForeignKey(LedgerTransaction, null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False)
    settled_at = models.DateTimeField(null=True, blank=True)  # reached paid, failed or canceled
    # The PSP failed or canceled a payout it had: the money it sent on (at Stripe, the transfer
    # to the merchant's connected account) is taken back through the gateway first
    # (payout_saga.payout_return), and only then moved back to the merchant, with the PSP's
    # failure code kept until then. Set until that move (or an operator's resolution).
    return_owed_at = models.DateTimeField(null=True, blank=True)
    # The text columns added to the live table keep their default in the database too (payments 0027).
    return_failure_code = models.CharField(max_length=50, blank=True, default="", db_default="")
    # The operator queue: a payout the saga stopped for a person (the PSP's payout of another
    # amount, currency or id; a reversal the PSP refused; staff stopping one the PSP cannot
    # resolve). Nothing moves it while `review_at` is set: two staff members resolve it,
    # `review_maker` proposing `review_outcome` (paid or failed), another confirming.
    # No index on the staff members: only rows in the queue have them, and nothing looks payouts up by them.
    review_at = models.DateTimeField(null=True, blank=True)
    review_reason = models.CharField(max_length=500, blank=True, default="", db_default="")
    review_outcome = models.CharField(max_length=10, blank=True, default="", db_default="")
    review_maker = models.ForeignKey(StaffMember, null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False)
    review_resolved_by = models.ForeignKey(StaffMember, null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False)
    review_resolved_at = models.DateTimeField(null=True, blank=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created", "-id"]
        permissions = [
            ("manage_payouts", "Can hold and release a merchant's payouts, and cancel a payout"),
            ("approve_payout", "Can approve a payout waiting for a staff member, or retry a failed one"),
            ("resolve_payout", "Can stop a payout for an operator, and resolve one in the operator queue"),
        ]
        indexes = [
            models.Index(fields=["-created", "-id"], name="payout_created"),
            models.Index(fields=["merchant", "-created", "-id"], name="payout_merchant_created"),
            # The recovery's payouts to send or ask about, and the queue of those in transit too long.
            models.Index(fields=["created"], name="payout_pending_created", condition=Q(status="pending")),
            models.Index(fields=["arrival_expected_at"], name="payout_in_transit_arrival", condition=Q(status="in_transit")),
            # The recovery's reversals owed, and the operator queue.
            models.Index(fields=["return_owed_at"], name="payout_return_owed", condition=Q(return_owed_at__isnull=False)),
            models.Index(fields=["review_at"], name="payout_in_review", condition=Q(review_at__isnull=False)),
            # The maker-checker's sum of what one staff member approved alone (staff_solo_postings_total).
            models.Index(
                fields=["approved_by", "asset", "approved_at"], name="payout_approved_alone",
                condition=Q(approved_by__isnull=False, approval_maker__isnull=True),
            ),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="payout_amount_positive"),
            # CHECKs compare with = and OR, never IN: a cloned schema re-reads IN's text differently (tenants.schemas).
            models.CheckConstraint(condition=_any_of("status", PayoutStatus.values), name="payout_status_known"),
            models.CheckConstraint(condition=~Q(status="paid") | Q(paid_transaction__isnull=False), name="payout_paid_has_ledger"),
            models.CheckConstraint(
                condition=~_any_of("status", ["failed", "canceled"]) | Q(returned_transaction__isnull=False), name="payout_returned_has_ledger"
            ),
            models.CheckConstraint(condition=~_any_of("status", ["in_transit", "paid"]) | ~Q(psp_reference=""), name="payout_sent_has_reference"),
            models.CheckConstraint(condition=~Q(status="canceled") | Q(attempts=0), name="payout_canceled_never_sent"),
            models.CheckConstraint(
                condition=Q(approval_maker__isnull=True) | ~Q(approved_by=F("approval_maker")), name="payout_checker_not_maker"
            ),
            models.CheckConstraint(
                condition=Q(review_maker__isnull=True) | ~Q(review_resolved_by=F("review_maker")), name="payout_review_checker_not_maker"
            ),
            models.UniqueConstraint(
                fields=["merchant", "asset", "schedule_day"], condition=Q(schedule_day__isnull=False), name="payout_scheduled_once_a_day"
            ),
            models.UniqueConstraint(fields=["psp_reference"], condition=~Q(psp_reference=""), name="payout_psp_reference_once"),
        ]

    @property
    def awaiting_approval(self) -> bool:
        return self.status == PayoutStatus.PENDING and self.approval_required and self.approved_at is None

    @property
    def in_review(self) -> bool:
        """In the operator queue: nothing moves it until two staff members resolve it."""
        return self.review_at is not None

    def __str__(self) -> str:
        return f"{self.id} {self.amount} {self.asset_id} ({self.status})"
