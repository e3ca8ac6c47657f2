"""Tenants (operators) and their domains. Lives in the public schema."""

from __future__ import annotations

import functools
import zoneinfo
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import connection, models
from django_tenants.models import DomainMixin, TenantMixin
from django_tenants.utils import get_creation_fakes_migrations, schema_exists

from tenants.approvals import ApprovalSettingInvalid, approval_settings_validate
from tenants.schemas import SchemaCloneRefused, schema_clone, schemas_missing_migrations

SETTLEMENT_DELAY_MAX_DAYS = 60


# Files in the tz database that ZoneInfo opens but that name no place's time: `right/` zones
# count leap seconds (their instants are not the ledger's), `posix/` duplicates every name,
# `localtime` is the server's own zone, `posixrules` and `Factory` are the database's internals.
_NOT_A_PLACE = ("localtime", "posixrules", "Factory")


@functools.cache
def _time_zone_names() -> frozenset[str]:
    return frozenset(name for name in zoneinfo.available_timezones()
                     if not name.startswith(("posix/", "right/")) and name not in _NOT_A_PLACE)


def time_zone_validate(name: str) -> None:
    if name not in _time_zone_names():
        raise ValidationError(f"{name!r} is not an IANA time zone name (for example Europe/Berlin)")


class IdempotencyMode(models.TextChoices):
    MANDATORY = "mandatory", "Mandatory (400 without a key)"
    OPTIONAL = "optional", "Optional (executed, counted as missing)"


class RefundFeePolicy(models.TextChoices):
    PROPORTIONAL = "proportional", "Proportional (a refund gives back its share of the payment's fee)"
    NONE = "none", "None (the fee is kept)"


class Tenant(TenantMixin):  # type: ignore[misc]  # django-tenants is untyped
    """An operator: one PostgreSQL schema with its own customers, merchants and assets."""

    name = models.CharField(max_length=200)
    main_currency = models.CharField(
        max_length=12, validators=[RegexValidator(r"^[A-Z][A-Z0-9_]{1,11}$")],
        help_text="Code of the main asset, e.g. JPY.",
    )
    currency_exponent = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(8)])
    is_active = models.BooleanField(default=True)
    created = models.DateTimeField(auto_now_add=True)

    # Idempotency rollout per face (SPEC 6).
    idempotency_customer = models.CharField(max_length=10, choices=IdempotencyMode.choices, default=IdempotencyMode.MANDATORY)
    idempotency_terminal = models.CharField(max_length=10, choices=IdempotencyMode.choices, default=IdempotencyMode.MANDATORY)
    idempotency_merchant = models.CharField(max_length=10, choices=IdempotencyMode.choices, default=IdempotencyMode.MANDATORY)
    idempotency_admin = models.CharField(max_length=10, choices=IdempotencyMode.choices, default=IdempotencyMode.MANDATORY)
    idempotency_replay_window_seconds = models.PositiveIntegerField(default=24 * 3600)
    idempotency_tombstone_window_seconds = models.PositiveIntegerField(default=24 * 3600)
    idempotency_wait_ms = models.PositiveIntegerField(default=5000, validators=[MaxValueValidator(30000)])

    # Points earned per main-currency minor unit spent; result rounded down (ROUND_FLOOR).
    points_earn_rate = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0.01"), validators=[MinValueValidator(0)])
    # Top-up bonus as a fraction of the top-up, paid from the bonus pool; rounded down (ROUND_FLOOR).
    topup_bonus_rate = models.DecimalField(max_digits=8, decimal_places=6, default=Decimal("0"), validators=[MinValueValidator(0)])
    # Grams of CO2 avoided per main-currency minor unit spent; rounded half-even (ROUND_HALF_EVEN).
    carbon_grams_per_unit = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0.5"), validators=[MinValueValidator(0)])
    # SPEC 4: charging by bare customer id instead of the single-use payment token (the QR) is
    # allowed only where the tenant turns this on, or the customer granted that merchant a mandate.
    charge_by_customer_id = models.BooleanField(default=False)
    # Days a merchant's credits stay pending before they are available (wallets.selectors.merchant_funds); a merchant may override it.
    # db_default here and below: the code before a column keeps inserting tenants during a rolling deploy.
    settlement_delay_days = models.PositiveSmallIntegerField(
        default=2, db_default=2, validators=[MaxValueValidator(SETTLEMENT_DELAY_MAX_DAYS)],
        help_text=f"Days (0 to {SETTLEMENT_DELAY_MAX_DAYS}) a merchant's credits stay pending before they are available for payout;"
        " a merchant may override it (its page in the tenant's admin).",
    )
    # What a refund does with the payment's fee (payments.services.refunds): proportional gives
    # back fee x refunded / amount, the cumulative share rounded down (all of it once fully refunded).
    refund_fee_policy = models.CharField(
        max_length=12, choices=RefundFeePolicy.choices, default=RefundFeePolicy.PROPORTIONAL, db_default=RefundFeePolicy.PROPORTIONAL
    )
    # Where a day and a month begin for statements, the month-end report and the daily figures
    # (the ledger and its daily totals stay in UTC instants and days).
    time_zone = models.CharField(
        max_length=64, default="UTC", db_default="UTC", validators=[time_zone_validate],
        help_text="IANA time zone name, e.g. Europe/Berlin or Asia/Tokyo: where the tenant's days and months begin.",
    )
    extra_settings = models.JSONField(default=dict, blank=True)  # what a later feature needs before it earns a column

    auto_create_schema = True
    auto_drop_schema = False

    class Meta:
        ordering = ["schema_name"]
        constraints = [
            models.CheckConstraint(condition=models.Q(settlement_delay_days__lte=SETTLEMENT_DELAY_MAX_DAYS), name="tenant_settlement_delay_days_max"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.schema_name})"

    def clean(self) -> None:
        try:
            approval_settings_validate(extra=self.extra_settings)
        except ApprovalSettingInvalid as exc:
            raise ValidationError({"extra_settings": str(exc)}) from exc

    def create_schema(self, check_if_exists: bool = False, sync_schema: bool = True, verbosity: int = 1) -> bool:
        """django-tenants' hook, called by save(): the schema is cloned from the template by
        `tenants.schemas.schema_clone`. A template behind the migrations on disk is refused,
        where django-tenants would record the missing ones as applied in the clone without
        running them (`tenant_template_ensure` migrates it first)."""
        base = self.get_base_schema() if get_creation_fakes_migrations() else False
        if not (sync_schema and base and schema_exists(base)):
            return bool(super().create_schema(check_if_exists=check_if_exists, sync_schema=sync_schema, verbosity=verbosity))
        if check_if_exists and schema_exists(self.schema_name):
            return False
        schema_clone(source=str(base), target=self.schema_name)
        missing = schemas_missing_migrations(schemas=[self.schema_name])[self.schema_name]
        if missing:
            raise SchemaCloneRefused(f"template {base!r} misses {missing} of the latest migrations: run migrate_schemas first")
        connection.set_schema_to_public()  # type: ignore[attr-defined]  # django-tenants' database wrapper
        return True

    def idempotency_mode_for(self, face: str) -> str:
        return str(getattr(self, f"idempotency_{face}"))


class Domain(DomainMixin):  # type: ignore[misc]  # django-tenants is untyped
    """A host name of a tenant (DomainMixin's __str__ is the host name)."""


class DueWorkKind(models.TextChoices):
    """What a tenant's due work is; who writes and settles each: docs/ARCHITECTURE.md."""

    RELAY = "relay", "Relay: events or deliveries due now"
    RELAY_LATER = "relay_later", "Relay: next retry"
    TOPUPS = "topups", "Top-up recovery"


class DueWork(models.Model):
    """A tenant's work of a kind that is due at `due_at` (public schema), read by the 10 s beat
    tasks (tenants/duework.py). Usually one row per tenant and kind; not unique on purpose."""

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, to_field="schema_name", on_delete=models.CASCADE, related_name="+", db_index=False)
    kind = models.CharField(max_length=16, choices=DueWorkKind.choices)
    due_at = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(fields=["tenant", "kind"], name="duework_tenant_kind"),
            models.Index(fields=["due_at"], name="duework_due_at"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.kind} due {self.due_at:%Y-%m-%d %H:%M:%S}"
