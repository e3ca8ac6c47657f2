"""The tenant admin for wallets' models, read-only. Customers, merchants and API keys, which
have staff actions, are registered by payments/admin.py beside those actions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from django.apps import apps
from django.contrib import admin
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join

from tenants.selectors import tenant_zone
from wallets.adminkit import ReadOnlyAdmin, ReadOnlyMixin, link, link_column, list_link_column, money, money_column
from wallets.books import account_balance_lines_at
from wallets.models import (
    Account,
    AccountDailyTotal,
    Asset,
    AuditEntry,
    Balance,
    Hold,
    LedgerEntry,
    LedgerTransaction,
    StaffMember,
    Store,
    Terminal,
)
from wallets.selectors import account_balance_lines


def balances_html(account: Account | None) -> str:
    """An account's balance per asset, each the sum over its shards, in the asset's units."""
    if account is None:
        return "-"
    assets = {a.code: a for a in Asset.objects.all()}
    return format_html_join(
        "<br>", "{}{}",
        (
            (money(line["balance"], assets.get(line["asset"])), f" (held {money(line['held'], assets.get(line['asset']))})" if line["held"] else "")
            for line in account_balance_lines(account=account)
            if line["balance"] or line["held"] or assets[line["asset"]].is_main
        ),
    )


@admin.register(Asset)
class AssetAdmin(ReadOnlyAdmin):
    list_display = ("code", "name", "kind", "exponent", "cap_display", "is_main", "created")
    list_filter = ("kind", "is_main")
    search_fields = ("code", "name")

    @admin.display(description="cap per wallet")
    def cap_display(self, obj: Asset) -> str:
        return money(obj.cap, obj)


@admin.register(Store)
class StoreAdmin(ReadOnlyAdmin):
    list_display = ("id", "name", link_column("merchant"), "created")
    search_fields = ("name",)
    id_search = {"sto": "id", "mer": "merchant_id"}
    list_select_related = ("merchant",)
    date_hierarchy = "created"


@admin.register(Terminal)
class TerminalAdmin(ReadOnlyAdmin):
    list_display = ("id", "name", link_column("store"), "created")
    search_fields = ("name",)
    id_search = {"ter": "id", "sto": "store_id"}
    list_select_related = ("store",)
    date_hierarchy = "created"


@admin.register(StaffMember)
class StaffMemberAdmin(ReadOnlyAdmin):
    list_display = ("id", "user", "created")
    search_fields = ("user__username",)
    id_search = {"stf": "id"}


class BalanceInline(ReadOnlyMixin, admin.TabularInline):  # type: ignore[type-arg]
    model = Balance
    fields = ("asset", "shard", "balance", "held", "frozen")
    ordering = ("asset", "shard")


@admin.register(Account)
class AccountAdmin(ReadOnlyAdmin):
    list_display = ("id", "kind", "owner", "balances", "frozen", "created")
    list_filter = ("kind", "frozen")
    id_search = {"acc": "id", "cus": "customer_id", "mer": "merchant_id"}
    list_select_related = ("customer", "merchant")
    date_hierarchy = "created"
    fields = ("id", "kind", "owner", "system_role", "frozen", "frozen_reason", "frozen_at", "balances", "balance_at", "entries", "created")
    inlines = [BalanceInline]
    entries = staticmethod(list_link_column(LedgerEntry, "entries", "account", description="ledger entries"))

    @admin.display(description="owner")
    def owner(self, obj: Account) -> str:
        return link(obj.customer or obj.merchant, None) if (obj.customer or obj.merchant) else str(obj.system_role)

    @admin.display(description="balances (shards summed)")
    def balances(self, obj: Account) -> str:
        return balances_html(obj)

    @admin.display(description="balance as of")
    def balance_at(self, obj: Account) -> str:
        return balance_at_link(obj)

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(self.balance_at_view)
        return [path("<path:object_id>/balance-at/", view, name="wallets_account_balance_at"), *super().get_urls()]

    def balance_at_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The account's balance per asset as of `at` (wallets.books): a local date and time
        in the tenant's zone (the form's), or an instant with its offset; not in the future."""
        account = Account.objects.filter(pk=object_id).first()
        if account is None or not self.has_view_permission(request, account):
            raise Http404("no such account")
        zone = tenant_zone()
        context: dict[str, Any] = {**self.admin_site.each_context(request), "account": account, "zone": zone.key, "lines": None,
                                   "title": f"{account}: balance as of", "opts": self.model._meta}
        raw = request.GET.get("at", "").strip()
        if raw:
            try:
                at = _admin_instant(raw, zone)
            except ValueError as exc:
                context["error"] = str(exc)
            else:
                assets = {a.code: a for a in Asset.objects.all()}
                context.update(
                    at_local=at.astimezone(zone).strftime("%Y-%m-%dT%H:%M:%S"), at_utc=at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"),
                    lines=[{"asset": line["asset"], "amount": money(int(line["balance"]), assets.get(str(line["asset"])))}
                           for line in account_balance_lines_at(account_id=account.pk, at=at)],
                )
        return TemplateResponse(request, "admin/wallets/account_balance_at.html", context)


def _admin_instant(raw: str, zone: ZoneInfo) -> datetime:
    """A staff member's `at`: ISO 8601, a wall clock read in `zone` (a time a DST change
    skips or repeats resolves as zoneinfo's fold=0 does), never in the future."""
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError:
        raise ValueError(f"{raw[:40]!r} is not a date and time (YYYY-MM-DDTHH:MM[:SS])") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=zone)
    try:
        at = parsed.astimezone(UTC)
    except OverflowError:
        raise ValueError("that instant is out of range") from None
    if at > datetime.now(UTC):
        raise ValueError("that instant is in the future: no balance is known yet")
    return at


def balance_at_link(account: Account | None) -> str:
    """A link to the account's "balance as of" page (for the customer's and merchant's pages too)."""
    if account is None:
        return "-"
    return format_html('<a href="{}">Balance as of an instant…</a>', reverse("admin:wallets_account_balance_at", args=[account.pk]))



class LedgerEntryInline(ReadOnlyMixin, admin.TabularInline):  # type: ignore[type-arg]
    model = LedgerEntry
    fields = ("account_link", "asset", "amount_display", "created")

    def get_queryset(self, request: HttpRequest) -> QuerySet[LedgerEntry]:
        return super().get_queryset(request).select_related("account", "asset")

    @admin.display(description="account")
    def account_link(self, obj: LedgerEntry) -> str:
        return link(obj.account)

    @admin.display(description="amount")
    def amount_display(self, obj: LedgerEntry) -> str:
        return money(obj.amount, obj.asset)


@admin.register(LedgerTransaction)
class LedgerTransactionAdmin(ReadOnlyAdmin):
    """The ledger: append-only (the database refuses UPDATE and DELETE)."""

    list_display = ("id", "kind", "reference_link", "created")
    # By id (the primary key index); no filters or drill-down: no index on kind or created.
    ordering = ("-id",)
    id_search = {"txn": "id"}
    fields = ("id", "kind", "reference_link", "created")
    inlines = [LedgerEntryInline]

    @admin.display(description="reference")
    def reference_link(self, obj: LedgerTransaction) -> str:
        models = {"pay": "Payment", "ref": "Refund", "trf": "Transfer", "top": "TopUp", "adj": "Adjustment", "pi": "PaymentIntent"}
        prefix = obj.reference.split("_", 1)[0]
        if prefix not in models:
            return obj.reference
        target = apps.get_model("payments", models[prefix]).objects.filter(pk=obj.reference).first()
        return link(target, obj.reference) if target is not None else obj.reference


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdmin):
    """Newest first by id, no filters or drill-down: entries have no index on `created`
    alone (the posting path should not pay for one)."""

    list_display = ("id", link_column("transaction"), link_column("account"), "asset", money_column("amount"), "created")
    ordering = ("-id",)
    id_search = {"txn": "transaction_id", "acc": "account_id"}
    list_select_related = ("transaction", "account", "asset")


@admin.register(Hold)
class HoldAdmin(ReadOnlyAdmin):
    list_display = ("id", link_column("account"), money_column("amount"), "status", "reference", "created")
    list_filter = ("status", "asset")
    id_search = {"hld": "id", "acc": "account_id", "pi": "payment_intent__id"}
    list_select_related = ("account", "asset")
    date_hierarchy = "created"


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    """The audit log: append-only (the database refuses UPDATE, DELETE and TRUNCATE)."""

    list_display = ("created", "actor", "action", "target_type", "target", "via", "ip", "request_id")
    list_filter = ("action", "via", "target_type")
    search_fields = ("=target_id", "=actor", "=request_id")
    date_hierarchy = "created"
    fields = ("created", "actor", "action", "target_type", "target", "reason", "before", "after", "via", "ip", "request_id")

    # Short target types written by services -> their model ("app.model" types name it).
    TARGET_MODELS = {"customer": "wallets.customer", "api_key": "wallets.apikey", "adjustment": "payments.adjustment",
                     "pending_adjustment": "payments.pendingadjustment"}

    @admin.display(description="target")
    def target(self, obj: AuditEntry) -> str:
        label = self.TARGET_MODELS.get(obj.target_type, obj.target_type)
        try:
            model = apps.get_model(label) if "." in label else None
        except LookupError:
            model = None
        target = model._default_manager.filter(pk=obj.target_id).first() if model is not None else None
        return link(target, obj.target_id) if target is not None else obj.target_id


@admin.register(AccountDailyTotal)
class AccountDailyTotalAdmin(ReadOnlyAdmin):
    """One row per shard; a day's total is the sum of its shards."""

    list_display = ("day", link_column("account"), "asset", "shard", money_column("credited"), money_column("debited"), "entries")
    list_filter = ("asset",)
    id_search = {"acc": "account_id"}
    list_select_related = ("account", "asset")
    date_hierarchy = "day"
