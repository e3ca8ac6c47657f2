"""A tenant's parties, assets, accounts, API keys, ledger, audit log and staged-migration state.

A foreign key has no index of its own (db_index=False) where no query looks rows up by it
and nothing deletes its target, or where a composite index leads with it: each index is a
relation in every tenant (the budget in tests/test_tenant_schemas.py)."""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.indexes import BrinIndex
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.utils import timezone

from tenants.models import SETTLEMENT_DELAY_MAX_DAYS
from wallets import ids
from wallets.abstract import PrefixedIdModel


class AssetKind(models.TextChoices):
    CURRENCY = "currency", "Main currency"
    POINTS = "points", "Points"
    CARBON = "carbon", "Carbon credits"
    REGIONAL = "regional", "Regional currency"


class Asset(models.Model):
    code = models.CharField(max_length=12, primary_key=True, validators=[RegexValidator(r"^[A-Z][A-Z0-9_]{1,11}$")])
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=10, choices=AssetKind.choices)
    exponent = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(8)])
    # Per-wallet cap in minor units: balance + amount <= cap, checked atomically.
    cap = models.BigIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    is_main = models.BooleanField(default=False)
    # Merchants are paid out in it (a currency of the tenant's, never points or carbon).
    payable = models.BooleanField(default=False, db_default=False)
    # A payout above this (minor units) waits for a staff member's approval; none: no limit.
    payout_approval_threshold = models.BigIntegerField(null=True, blank=True, validators=[MinValueValidator(0)])
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["code"]
        constraints = [
            models.UniqueConstraint(fields=["is_main"], condition=models.Q(is_main=True), name="asset_one_main"),
            models.CheckConstraint(condition=models.Q(cap__isnull=True) | models.Q(cap__gt=0), name="asset_cap_positive"),
            models.CheckConstraint(
                condition=models.Q(payable=False) | models.Q(kind="currency") | models.Q(kind="regional"), name="asset_payable_is_money"
            ),
        ]

    def __str__(self) -> str:
        return self.code


class Customer(PrefixedIdModel, new_id=ids.new_customer_id):
    name = models.CharField(max_length=200)
    # Contact data, encrypted at rest (wallets.contacts): NULL not written yet, token of "" empty.
    email_ciphertext = models.TextField(null=True, blank=True, editable=False)
    phone_ciphertext = models.TextField(null=True, blank=True, editable=False)
    # Keyed hash of the normalised email, for lookups without decrypting; NULL: no email.
    email_hash = models.CharField(max_length=64, null=True, blank=True, editable=False, db_index=True)

    class Meta:
        ordering = ["created", "id"]
        indexes = [models.Index(fields=["created", "id"], name="customer_created")]  # the admin's list order


class CustomerLegacyContact(models.Model):
    """The plaintext contact columns of `wallets_customer`, unmanaged: only wallets.contacts
    touches them, until the staged migration `customer_contacts` drops them."""

    id = models.CharField(max_length=ids.ID_MAX_LENGTH, primary_key=True)
    email = models.CharField(max_length=254, blank=True, default="")
    phone = models.CharField(max_length=32, blank=True, default="")

    class Meta:
        managed = False
        db_table = "wallets_customer"


class PayoutSchedule(models.TextChoices):
    DAILY = "daily", "Daily"
    WEEKLY = "weekly", "Weekly (on its weekday)"
    MANUAL = "manual", "Manual (POST /v1/merchant/payouts)"


class Merchant(PrefixedIdModel, new_id=ids.new_merchant_id):
    name = models.CharField(max_length=200)
    # None: the tenant's settlement delay applies (wallets.selectors.merchant_settlement_delay_days).
    settlement_delay_days = models.PositiveSmallIntegerField(null=True, blank=True, validators=[MaxValueValidator(SETTLEMENT_DELAY_MAX_DAYS)])
    # Scheduled payouts of the whole available balance (payments.services.payouts); weekly on
    # `payout_weekday` (0 Monday .. 6 Sunday, UTC days).
    payout_schedule = models.CharField(max_length=8, choices=PayoutSchedule.choices, default=PayoutSchedule.MANUAL, db_default="manual")
    payout_weekday = models.PositiveSmallIntegerField(null=True, blank=True, validators=[MaxValueValidator(6)])
    # Staff hold a merchant's payouts: none is made or sent until they release them (audited).
    payouts_held = models.BooleanField(default=False, db_default=False)
    payouts_held_reason = models.CharField(max_length=500, blank=True, default="", db_default="")
    payouts_held_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created", "id"]
        # Its own permission, not change_merchant: finance sets the delay and nothing else of a merchant.
        permissions = [("set_settlement_delay", "Can set a merchant's settlement delay")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(settlement_delay_days__lte=SETTLEMENT_DELAY_MAX_DAYS), name="merchant_settlement_delay_days_max"
            ),
            models.CheckConstraint(
                condition=models.Q(payout_schedule="weekly", payout_weekday__isnull=False, payout_weekday__lte=6)
                | (~models.Q(payout_schedule="weekly") & models.Q(payout_weekday__isnull=True)),
                name="merchant_weekly_payouts_have_a_weekday",
            ),
        ]


class Store(PrefixedIdModel, new_id=ids.new_store_id):
    merchant = models.ForeignKey(Merchant, on_delete=models.PROTECT, related_name="stores")
    name = models.CharField(max_length=200)

    class Meta:
        ordering = ["created", "id"]


class Terminal(PrefixedIdModel, new_id=ids.new_terminal_id):
    store = models.ForeignKey(Store, on_delete=models.PROTECT, related_name="terminals")
    name = models.CharField(max_length=200)

    class Meta:
        ordering = ["created", "id"]


class StaffMember(PrefixedIdModel, new_id=ids.new_staff_id):
    """An operator's staff member: an API principal (`ak_` keys) tied to an admin login."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="staff_member")

    def __str__(self) -> str:
        return f"{self.user.get_username()} ({self.id})"


class AccountKind(models.TextChoices):
    CUSTOMER = "customer", "Customer wallet"
    MERCHANT = "merchant", "Merchant account"
    SYSTEM = "system", "System account"


class SystemRole(models.TextChoices):
    """System accounts may go negative; they are the other side of money entering or leaving."""

    # The tenant's position at the PSP: card top-ups come in from it, paid payouts go out to it.
    PSP_FUNDING = "psp_funding", "PSP settlement (card top-ups in, payouts out)"
    BONUS_POOL = "bonus_pool", "Bonus pool (top-up bonuses, points issuance)"
    FEES = "fees", "Fees"
    CARBON_REGISTRY = "carbon_registry", "Carbon registry"
    ADJUSTMENTS = "adjustments", "Staff adjustments"
    PAYOUTS_IN_TRANSIT = "payouts_in_transit", "Payouts in transit (left the merchant, not yet paid)"


class Account(PrefixedIdModel, new_id=ids.new_account_id):
    kind = models.CharField(max_length=10, choices=AccountKind.choices)
    customer = models.OneToOneField(Customer, null=True, blank=True, on_delete=models.PROTECT, related_name="account")
    merchant = models.OneToOneField(Merchant, null=True, blank=True, on_delete=models.PROTECT, related_name="account")
    system_role = models.CharField(max_length=20, choices=SystemRole.choices, null=True, blank=True, unique=True)
    frozen = models.BooleanField(default=False)
    frozen_reason = models.CharField(max_length=500, blank=True, default="")
    frozen_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created", "id"]
        permissions = [("freeze_account", "Can freeze and unfreeze a wallet")]
        indexes = [models.Index(fields=["created", "id"], name="account_created")]  # the admin's list order
        constraints = [
            models.CheckConstraint(
                condition=(
                    models.Q(kind="customer", customer__isnull=False, merchant__isnull=True, system_role__isnull=True)
                    | models.Q(kind="merchant", merchant__isnull=False, customer__isnull=True, system_role__isnull=True)
                    | models.Q(kind="system", system_role__isnull=False, customer__isnull=True, merchant__isnull=True)
                ),
                name="account_owner_matches_kind",
            )
        ]

    def balance_new(self, *, asset_code: str, shard: int) -> Balance:
        """An empty balance row of this account (not saved); only system accounts may go negative."""
        return Balance(account_id=self.id, asset_id=asset_code, shard=shard, may_go_negative=self.kind == AccountKind.SYSTEM, frozen=self.frozen)

    def __str__(self) -> str:
        return f"{self.kind}:{self.system_role or self.customer_id or self.merchant_id}"


class PrincipalType(models.TextChoices):
    CUSTOMER = "customer", "Customer"
    MERCHANT = "merchant", "Merchant"
    TERMINAL = "terminal", "Terminal"
    STAFF = "staff", "Staff"


KEY_PREFIXES = {PrincipalType.CUSTOMER: "ck_", PrincipalType.MERCHANT: "sk_", PrincipalType.TERMINAL: "tk_", PrincipalType.STAFF: "ak_"}


class ApiKey(PrefixedIdModel, new_id=ids.new_api_key_id):
    """A bearer key. Only its SHA-256 is stored; the key itself is shown once."""

    principal_type = models.CharField(max_length=10, choices=PrincipalType.choices)
    customer = models.ForeignKey(Customer, null=True, blank=True, on_delete=models.PROTECT, related_name="api_keys")
    merchant = models.ForeignKey(Merchant, null=True, blank=True, on_delete=models.PROTECT, related_name="api_keys")
    terminal = models.ForeignKey(Terminal, null=True, blank=True, on_delete=models.PROTECT, related_name="api_keys")
    staff = models.ForeignKey(StaffMember, null=True, blank=True, on_delete=models.PROTECT, related_name="api_keys")
    # The visible start of the key (e.g. "ck_Ab12"), for recognising it in lists and logs.
    prefix = models.CharField(max_length=16)
    key_hash = models.CharField(max_length=64, unique=True)
    # Set when the key is rotated: it keeps working until then (overlap window).
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API key"
        verbose_name_plural = "API keys"
        ordering = ["created", "id"]
        permissions = [
            ("manage_apikey", "Can revoke API keys"),
            # Its own permission: whoever mints a key can act as its principal (spend a
            # customer's money), so this is kept apart from the other key chores.
            ("issue_apikey", "Can create and rotate API keys (a staff member's only with every permission they hold)"),
        ]
        indexes = [models.Index(fields=["created", "id"], name="apikey_created")]  # the admin's list order
        constraints = [
            models.CheckConstraint(
                condition=(
                    models.Q(principal_type="customer", customer__isnull=False, merchant__isnull=True, terminal__isnull=True, staff__isnull=True)
                    | models.Q(principal_type="merchant", merchant__isnull=False, customer__isnull=True, terminal__isnull=True, staff__isnull=True)
                    | models.Q(principal_type="terminal", terminal__isnull=False, customer__isnull=True, merchant__isnull=True, staff__isnull=True)
                    | models.Q(principal_type="staff", staff__isnull=False, customer__isnull=True, merchant__isnull=True, terminal__isnull=True)
                ),
                name="api_key_principal_matches_type",
            )
        ]

    @property
    def principal_id(self) -> str:
        return str(self.customer_id or self.merchant_id or self.terminal_id or self.staff_id)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.principal_type} {self.principal_id})"


# Codes of the reward assets every tenant has (created by tenant_ledger_bootstrap).
POINTS_ASSET = "POINT"
CARBON_ASSET = "CARBON"

# Merchant and system balances are split over this many rows ("shards") so that concurrent
# payments to one merchant (or system account) do not queue on one row lock; the balance is
# the SUM over the shards. Customer wallets have shard 0 only.
BALANCE_SHARDS = 32


class Balance(models.Model):
    """One balance row of an (account, asset, shard), changed only with the ledger entries
    that explain the change. `held` is reserved by active holds: available = balance - held."""

    id = models.BigAutoField(primary_key=True)
    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="balances", db_index=False)
    asset = models.ForeignKey(Asset, on_delete=models.PROTECT, related_name="+", db_index=False)
    shard = models.SmallIntegerField(default=0)
    balance = models.BigIntegerField(default=0)
    held = models.BigIntegerField(default=0)
    # Denormalised from Account.kind so the CHECK below can see it (system accounts may go negative).
    may_go_negative = models.BooleanField(default=False)
    # Denormalised from Account.frozen by the freeze: a payment that waited on this row
    # while a freeze committed sees it here (the account row it joined would be stale).
    frozen = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["account", "asset", "shard"], name="balance_account_asset_shard_uniq"),
            models.CheckConstraint(condition=models.Q(held__gte=0), name="balance_held_non_negative"),
            models.CheckConstraint(
                condition=models.Q(may_go_negative=True) | models.Q(balance__gte=models.F("held")),
                name="balance_covers_held_unless_system",
            ),
            models.CheckConstraint(condition=models.Q(shard__gte=0, shard__lt=BALANCE_SHARDS), name="balance_shard_in_range"),
        ]

    def __str__(self) -> str:
        return f"{self.account_id}/{self.asset_id}#{self.shard}: {self.balance} (held {self.held})"


class LedgerTransactionKind(models.TextChoices):
    PAYMENT = "payment", "Payment"
    REFUND = "refund", "Refund"
    TRANSFER = "transfer", "Transfer"
    TOPUP = "topup", "Top-up"
    ADJUSTMENT = "adjustment", "Adjustment"
    CAPTURE = "capture", "Intent capture"
    PAYOUT = "payout", "Payout (merchant to in transit)"
    PAYOUT_PAID = "payout_paid", "Payout paid (in transit to the PSP)"
    PAYOUT_BACK = "payout_back", "Payout failed or canceled (back to the merchant)"


class LedgerTransaction(PrefixedIdModel, new_id=ids.new_ledger_transaction_id):
    """One movement: two or more entries summing to zero per asset. Append-only (DB trigger)."""

    kind = models.CharField(max_length=12, choices=LedgerTransactionKind.choices)
    # The business object that caused it (pay_..., ref_...). Not indexed: every payment would
    # pay for it; lookups go from the business object's ledger_transaction_id.
    reference = models.CharField(max_length=ids.ID_MAX_LENGTH)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created", "id"]
        # A failed payout's money coming back is available at once: the pending window's read
        # leaves these out (wallets.selectors), and they are few, so the index costs other
        # postings nothing.
        indexes = [models.Index(fields=["created"], name="ledgertxn_payout_back", condition=models.Q(kind="payout_back"))]

    def __str__(self) -> str:
        return f"{self.id} {self.kind} {self.reference}"


class LedgerEntry(models.Model):
    """A signed amount on one (account, asset): positive credits, negative debits. Append-only."""

    id = models.BigAutoField(primary_key=True)
    # No database foreign keys on this hot append-only table: every payment would take KEY
    # SHARE locks on the same hot rows (a MultiXact each), and the transaction is inserted
    # with its entries and never deleted. Reconciliation checks the references.
    transaction = models.ForeignKey(LedgerTransaction, on_delete=models.PROTECT, related_name="entries", db_constraint=False)
    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="entries", db_constraint=False, db_index=False)
    asset = models.ForeignKey(Asset, on_delete=models.PROTECT, related_name="+", db_constraint=False, db_index=False)
    amount = models.BigIntegerField()
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "ledger entry"
        verbose_name_plural = "ledger entries"
        ordering = ["created", "id"]
        indexes = [
            models.Index(fields=["account", "created", "id"], name="ledgerentry_account_created"),
            # A whole tenant's partial day (the trial balance): entries arrive in about `created` order.
            BrinIndex(fields=["created"], name="ledgerentry_created_brin"),
        ]
        constraints = [models.CheckConstraint(condition=~models.Q(amount=0), name="ledgerentry_amount_non_zero")]

    def __str__(self) -> str:
        return f"{self.transaction_id} {self.account_id} {self.asset_id} {self.amount:+d}"


class HoldStatus(models.TextChoices):
    ACTIVE = "active", "Active"
    CAPTURED = "captured", "Captured"
    RELEASED = "released", "Released"


class Hold(PrefixedIdModel, new_id=ids.new_hold_id):
    """Funds reserved on a customer wallet (an authorized intent): counted in Balance.held."""

    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="holds")
    asset = models.ForeignKey(Asset, on_delete=models.PROTECT, related_name="+", db_index=False)
    amount = models.BigIntegerField()
    status = models.CharField(max_length=10, choices=HoldStatus.choices, default=HoldStatus.ACTIVE)
    reference = models.CharField(max_length=ids.ID_MAX_LENGTH)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created", "id"]
        constraints = [models.CheckConstraint(condition=models.Q(amount__gt=0), name="hold_amount_positive")]

    def __str__(self) -> str:
        return f"{self.id} {self.amount} {self.asset_id} ({self.status})"


class AuditEntry(models.Model):
    """One staff action or sensitive change: who, what, before and after, when, from where.
    Append-only (trigger `tally_audit_append_only`); written only by audit_record, and by
    the trigger that revokes a deactivated staff login's keys (`tally_staff_login_keys_revoke`)."""

    id = models.BigAutoField(primary_key=True)
    created = models.DateTimeField(default=timezone.now)
    actor = models.CharField(max_length=200)  # user:<username> | <principal type>:<id> key <prefix> | system
    action = models.CharField(max_length=64)  # e.g. api_key.revoke, wallet.freeze, refund.create
    target_type = models.CharField(max_length=64)
    target_id = models.CharField(max_length=64)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    reason = models.CharField(max_length=500, blank=True, default="")
    via = models.CharField(max_length=10)  # admin | api | system
    ip = models.GenericIPAddressField(null=True, blank=True)
    request_id = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        ordering = ["-created", "-id"]
        verbose_name_plural = "audit entries"
        indexes = [
            models.Index(fields=["-created", "-id"], name="audit_created"),
            models.Index(fields=["target_type", "target_id", "-created"], name="audit_target"),
            models.Index(fields=["action", "-created"], name="audit_action"),
        ]

    def __str__(self) -> str:
        return f"{self.created:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.target_type}:{self.target_id}"


class StagedPhase(models.TextChoices):
    """The phases of a staged data migration, in order (wallets.staged)."""

    ABSENT = "absent", "Not started: old representation only"
    EXPANDED = "expanded", "Expanded: new representation exists, dual writes on"
    BACKFILLED = "backfilled", "Backfilled: every old row copied"
    VERIFIED = "verified", "Verified: old and new compared equal"
    READS_SWITCHED = "reads_switched", "Reads switched to the new representation"
    CONTRACTING = "contracting", "Contracting: old representation being removed"
    CONTRACTED = "contracted", "Contracted: new representation only"


class StagedMigrationState(models.Model):
    """Where one staged data migration stands in this tenant (written by wallets.staged.runner)."""

    name = models.CharField(max_length=64, primary_key=True)
    phase = models.CharField(max_length=16, choices=StagedPhase.choices, default=StagedPhase.ABSENT)
    phase_changed_at = models.DateTimeField(default=timezone.now)
    cursor = models.CharField(max_length=200, blank=True, default="")
    rows_total = models.BigIntegerField(default=0)
    rows_done = models.BigIntegerField(default=0)
    rows_written = models.BigIntegerField(default=0)
    backfill_started_at = models.DateTimeField(null=True, blank=True)
    backfill_finished_at = models.DateTimeField(null=True, blank=True)
    backfill_seconds = models.FloatField(default=0.0)
    verified_at = models.DateTimeField(null=True, blank=True)
    verify_ok = models.BooleanField(null=True, blank=True)
    verify_report = models.JSONField(default=dict, blank=True)
    history = models.JSONField(default=list, blank=True)
    # A rollback of expand left new data to discard: expand discards it first (write-if-absent
    # must not meet stale data).
    discard_pending = models.BooleanField(default=False)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name}: {self.phase}"


class AccountDailyTotal(models.Model):
    """What the ledger posted to an account (merchant, customer or system) on one UTC day in
    one asset (kept by wallets.daily_totals), sharded like balances: a day's totals are the
    SUM of its shard rows. The table keeps the name it had when it held merchants only: a
    rename would break the code still running during a deploy, which writes it."""

    id = models.BigAutoField(primary_key=True)
    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="+", db_constraint=False, db_index=False)
    asset = models.ForeignKey(Asset, on_delete=models.PROTECT, related_name="+", db_constraint=False, db_index=False)
    day = models.DateField()
    shard = models.SmallIntegerField(default=0)
    credited = models.BigIntegerField(default=0)
    debited = models.BigIntegerField(default=0)
    entries = models.BigIntegerField(default=0)
    # Of a merchant's `credited`, the money of failed or canceled payouts coming back
    # (PAYOUT_BACK): it was available when it left, so it is available again at once, never
    # pending. Always 0 on other accounts.
    returned = models.BigIntegerField(default=0, db_default=0)

    class Meta:
        db_table = "wallets_merchantdailytotal"
        constraints = [
            models.UniqueConstraint(fields=["account", "asset", "day", "shard"], name="merchantdailytotal_key_uniq"),
            models.CheckConstraint(condition=models.Q(credited__gte=0, debited__gte=0, entries__gte=0), name="merchantdailytotal_non_negative"),
            models.CheckConstraint(
                condition=models.Q(returned__gte=0, returned__lte=models.F("credited")), name="merchantdailytotal_returned_in_credited"
            ),
            models.CheckConstraint(condition=models.Q(shard__gte=0, shard__lt=BALANCE_SHARDS), name="merchantdailytotal_shard_in_range"),
        ]

    def __str__(self) -> str:
        day = f"{self.account_id}/{self.asset_id}/{self.day}#{self.shard}"
        return f"{day}: +{self.credited} (returned {self.returned}) -{self.debited} ({self.entries})"
