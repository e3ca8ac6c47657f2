"""The tenant admin for money objects, and for the wallets models whose staff actions go
through payments' services (customers, merchants, API keys). Rows are read-only; every
change is a staff action (payments/admin_actions.py)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from idempotency.admin import StaffActionForm, staff_form_submit
from idempotency.models import IdempotencyRecord
from payments.admin_actions import OptionalReasonForm, ReasonForm, StaffAction, StaffActionsMixin, staff_of
from payments.admin_statements import StatementDownloadMixin
from payments.models import (
    FEE_RATE_PLACES,
    Adjustment,
    AdjustmentDirection,
    FeeRounding,
    FeeSchedule,
    GatewayAccount,
    Mandate,
    MerchantBankAccount,
    OutboxEvent,
    Payment,
    PaymentIntent,
    PaymentToken,
    Payout,
    PayoutStatus,
    PendingAdjustment,
    PendingAdjustmentStatus,
    PspWebhookEvent,
    Refund,
    TopUp,
    TopUpStatus,
    Transfer,
)
from payments.selectors import payouts_in_review, payouts_in_transit_overdue, topup_queue
from payments.services.approvals import adjustment_request, pending_adjustment_approve, pending_adjustment_reject
from payments.services.fees import fee_schedule_create
from payments.services.freezes import wallet_freeze, wallet_unfreeze
from payments.services.payouts import (
    REVIEW_OUTCOMES,
    bank_account_attach,
    merchant_payout_schedule_set,
    merchant_payouts_hold,
    payout_approve,
    payout_cancel,
    payout_retry,
    payout_review_resolve,
    payout_review_stop,
    payout_review_stop_prepare,
)
from payments.services.refunds import refund_create
from payments.services.topup_review import topup_review_fail_refunding, topup_review_settle
from tenants.admin import tenant_panel_register
from tenants.models import SETTLEMENT_DELAY_MAX_DAYS
from tenants.selectors import tenant_current
from wallets.admin import balance_at_link, balances_html
from wallets.adminkit import ReadOnlyAdmin, ReadOnlyMixin, link, link_column, link_to_list, list_link_column, money, money_column
from wallets.contacts import customer_contact_masked, customers_find_by_email
from wallets.models import Account, ApiKey, Asset, AuditEntry, Customer, LedgerEntry, Merchant, PayoutSchedule, Store
from wallets.selectors import merchant_funds, merchant_get, merchant_settlement_delay_days
from wallets.services.principals import api_key_revoke, api_key_rotate, merchant_settlement_delay_set


def _audit_column(target_type: str) -> Callable[[Any], str]:
    return list_link_column(AuditEntry, "audit log", "target_id", description="audit", target_type=target_type)


_events = list_link_column(OutboxEvent, "outbox events", "q", description="events")


@admin.display(description="amount")
def _refund_amount(refund: Refund) -> str:
    return money(refund.amount, refund.payment.asset)


# --- Customers (wallets) ------------------------------------------------------------------


class AdjustForm(StaffActionForm):
    asset = forms.ModelChoiceField(queryset=Asset.objects.all(), to_field_name="code")
    amount = forms.IntegerField(min_value=1, help_text="In the asset's minor units (cents for EUR, yen for JPY, grams for CARBON).")
    direction = forms.ChoiceField(choices=AdjustmentDirection.choices)
    reason = forms.CharField(max_length=500, widget=forms.Textarea(attrs={"rows": 2, "cols": 60}))

    def clean_asset(self) -> str:
        return str(self.cleaned_data["asset"].code)


def _adjust_action(field: str) -> StaffAction:
    """The "Adjust balance" action of a customer or a merchant page."""

    def run(request: HttpRequest, party: Any, data: dict[str, Any]) -> str:
        result = adjustment_request(
            maker=staff_of(request), asset_code=data["asset"], amount=data["amount"], direction=data["direction"],
            reason=data["reason"], **{field: party},
        )
        if isinstance(result, PendingAdjustment):
            return (f"Adjustment {result.pk} would take what you posted alone in this asset over the approval threshold:"
                    " waiting for a second staff member's approval")
        return f"Adjustment {result.pk} posted ({result.direction} {money(result.amount, result.asset)})"

    return StaffAction("adjust", "Adjust balance", "payments.add_pendingadjustment", AdjustForm, run,
                       description="A credit or debit against the adjustments account, with a reason. Above the tenant's threshold a"
                       " second staff member must approve it.", audit=False)


def _frozen(customer: Customer) -> bool:
    return bool(Account.objects.filter(customer=customer, frozen=True).exists())


@admin.register(Customer)
class CustomerAdmin(StatementDownloadMixin, StaffActionsMixin, ReadOnlyAdmin):
    list_display = ("id", "name", "wallet", "created")
    search_fields = ("name",)
    id_search = {"cus": "id"}
    date_hierarchy = "created"
    # Email and phone live in the contact representation of the staged migration
    # (wallets.contacts): shown masked, searched by exact email through its lookup.
    fields = ("id", "name", "contact", "created", "wallet", "balance_at", "frozen", "related")
    staff_actions = (
        StaffAction("freeze", "Freeze wallet", "wallets.freeze_account", ReasonForm,
                    lambda request, obj, data: f"Wallet {wallet_freeze(customer=obj, staff=staff_of(request), reason=data['reason']).pk} frozen",
                    description="Payments, transfers, refunds and top-ups are refused until the wallet is unfrozen.",
                    audit=False, show=lambda obj: not _frozen(obj)),
        StaffAction("unfreeze", "Unfreeze wallet", "wallets.freeze_account", OptionalReasonForm,
                    lambda request, obj, data: f"Wallet {wallet_unfreeze(customer=obj, staff=staff_of(request), reason=data['reason']).pk} unfrozen",
                    audit=False, show=_frozen),
        _adjust_action("customer"),
    )

    @admin.display(description="wallet (shards summed)")
    def wallet(self, obj: Customer) -> str:
        return balances_html(Account.objects.filter(customer=obj).first())

    @admin.display(description="balance as of")
    def balance_at(self, obj: Customer) -> str:
        return balance_at_link(Account.objects.filter(customer=obj).first())

    @admin.display(description="contact (masked)")
    def contact(self, obj: Customer) -> str:
        masked = customer_contact_masked(customer=obj)
        return " · ".join(part for part in (masked.email, masked.phone) if part) or "-"

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Customer], search_term: str) -> tuple[QuerySet[Customer], bool]:
        if "@" in search_term:  # an exact email: the contact lookup (hash or plaintext, per phase)
            return queryset.filter(pk__in=customers_find_by_email(email=search_term.strip()).values("pk")), False
        return super().get_search_results(request, queryset, search_term)

    @admin.display(description="frozen")
    def frozen(self, obj: Customer) -> str:
        account = Account.objects.filter(customer=obj).first()
        return f"yes: {account.frozen_reason}" if account is not None and account.frozen else "no"

    @admin.display(description="related")
    def related(self, obj: Customer) -> str:
        account = Account.objects.filter(customer=obj).first()
        parts = [
            link(account, "wallet account"), link_to_list(Payment, "payments", customer=obj.pk),
            link_to_list(LedgerEntry, "ledger entries", account=account.pk) if account else "",
            link_to_list(ApiKey, "API keys", customer=obj.pk), _audit_column("customer")(obj),
        ]
        return " · ".join(p for p in parts if p)


class SettlementDelayForm(OptionalReasonForm):
    settlement_delay_days = forms.IntegerField(
        min_value=0, max_value=SETTLEMENT_DELAY_MAX_DAYS, required=False, help_text="Days; empty: the tenant's setting applies."
    )


def _settlement_delay(request: HttpRequest, merchant: Merchant, data: dict[str, Any]) -> str:
    merchant_settlement_delay_set(merchant=merchant, days=data["settlement_delay_days"])
    return f"Settlement delay of {merchant.pk}: {merchant_settlement_delay_days(merchant=merchant)} days"


class BankAccountForm(StaffActionForm):
    token = forms.CharField(max_length=200, help_text="The PSP's token of the bank account (the simulator's: btok_bank). Tally keeps"
                            " the PSP's reference and the last four digits only.")


class PayoutScheduleForm(StaffActionForm):
    schedule = forms.ChoiceField(choices=PayoutSchedule.choices)
    weekday = forms.TypedChoiceField(choices=[("", "-"), *((str(i), d) for i, d in enumerate(
        ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")))], coerce=int, empty_value=None, required=False,
        help_text="For a weekly schedule only (UTC days).")


def _bank_account(request: HttpRequest, merchant: Merchant, data: dict[str, Any]) -> str:
    bank = bank_account_attach(merchant=merchant, token=data["token"], staff=staff_of(request))
    return f"Bank account •••• {bank.last4} attached at {bank.gateway}: payouts to it wait for approval for 7 days"


@admin.register(Merchant)
class MerchantAdmin(StatementDownloadMixin, StaffActionsMixin, ReadOnlyAdmin):
    list_display = ("id", "name", "balances", "stores", "payout_schedule", "payouts_held", "created")
    list_filter = ("payout_schedule", "payouts_held")
    search_fields = ("name",)
    id_search = {"mer": "id"}
    date_hierarchy = "created"
    fields = ("id", "name", "created", "balances", "funds", "settlement_delay", "stores", "payments", "bank_account", "payout_schedule",
              "payout_weekday", "payouts_state", "payouts", "audit", "balance_at")
    staff_actions = (
        _adjust_action("merchant"),
        StaffAction("bank_account", "Attach or change the bank account", "payments.attach_bank_account", BankAccountForm, _bank_account,
                    description="Hands the PSP's token to the PSP, which holds the account; audited.", audit=False),
        StaffAction("payout_schedule", "Set the payout schedule", "payments.manage_payouts", PayoutScheduleForm,
                    lambda request, obj, data: f"Payouts {merchant_payout_schedule_set(merchant=obj, **data).payout_schedule}",
                    description="Daily or weekly: one payout of the whole available balance per payable asset.", audit=False),
        StaffAction("hold_payouts", "Hold payouts", "payments.manage_payouts", ReasonForm,
                    lambda request, obj, data: f"Payouts of {merchant_payouts_hold(merchant=obj, held=True, reason=data['reason']).pk} held",
                    description="No payout is made or sent until they are released.", audit=False, show=lambda obj: not obj.payouts_held),
        StaffAction("release_payouts", "Release payouts", "payments.manage_payouts", OptionalReasonForm,
                    lambda request, obj, data: f"Payouts of {merchant_payouts_hold(merchant=obj, held=False, reason=data['reason']).pk}"
                    " released", audit=False, show=lambda obj: obj.payouts_held),
        StaffAction("settlement_delay", "Set settlement delay", "wallets.set_settlement_delay", SettlementDelayForm, _settlement_delay,
                    description="How many days the merchant's credits stay pending before they are available; empty: the tenant's."),
    )
    stores = staticmethod(list_link_column(Store, "stores", "merchant"))
    payments = staticmethod(list_link_column(Payment, "payments", "merchant"))
    payouts = staticmethod(list_link_column(Payout, "payouts", "merchant"))
    audit = staticmethod(_audit_column("merchant"))

    @admin.display(description="bank account")
    def bank_account(self, obj: Merchant) -> str:
        bank = MerchantBankAccount.objects.filter(merchant=obj).first()
        return f"•••• {bank.last4} at {bank.gateway} ({bank.psp_reference}), changed {bank.changed_at:%Y-%m-%d %H:%M} UTC" if bank else "-"

    @admin.display(description="payouts held")
    def payouts_state(self, obj: Merchant) -> str:
        return f"held since {obj.payouts_held_at:%Y-%m-%d %H:%M} UTC: {obj.payouts_held_reason}" if obj.payouts_held else "no"

    @admin.display(description="balances (shards summed)")
    def balances(self, obj: Merchant) -> str:
        return balances_html(Account.objects.filter(merchant=obj).first())

    @admin.display(description="balance as of")
    def balance_at(self, obj: Merchant) -> str:
        return balance_at_link(Account.objects.filter(merchant=obj).first())

    @admin.display(description="available / pending")
    def funds(self, obj: Merchant) -> str:
        assets = {a.code: a for a in Asset.objects.all()}
        return format_html_join(
            "<br>", "{}: {} available, {} pending",
            ((f.asset_code, money(f.available, assets[f.asset_code]), money(f.pending, assets[f.asset_code]))
             for f in merchant_funds(merchant=obj) if f.balance),
        ) or "-"

    @admin.display(description="settlement delay")
    def settlement_delay(self, obj: Merchant) -> str:
        days = merchant_settlement_delay_days(merchant=obj)
        return f"{days} days" + (" (the tenant's)" if obj.settlement_delay_days is None else "")


# --- API keys (wallets) ---------------------------------------------------------------------


class RotateForm(StaffActionForm):
    overlap_seconds = forms.IntegerField(min_value=0, max_value=7 * 24 * 3600, initial=24 * 3600,
                                         help_text="How long the old key keeps working.")


def _rotate(request: HttpRequest, obj: ApiKey, data: dict[str, Any]) -> tuple[str, str]:
    assert isinstance(request.user, User)  # the admin serves logged-in staff only
    new_key, raw_key = api_key_rotate(api_key=obj, issuer=request.user, overlap=timedelta(seconds=data["overlap_seconds"]))
    return f"New key {new_key.pk} ({new_key.prefix}…) replaces {obj.pk}, which stops working at its expiry", raw_key


def _live(key: ApiKey) -> bool:
    return key.revoked_at is None


@admin.register(ApiKey)
class ApiKeyAdmin(StaffActionsMixin, ReadOnlyAdmin):
    """API keys: never the secret (only its visible prefix; the hash is not shown either)."""

    list_display = ("id", "prefix", "principal_type", "principal", "created", "expires_at", "revoked_at", "last_used_at")
    list_filter = ("principal_type", ("revoked_at", admin.EmptyFieldListFilter))
    id_search = {"key": "id", "cus": "customer_id", "mer": "merchant_id", "ter": "terminal_id", "stf": "staff_id"}
    search_fields = ("=prefix",)
    date_hierarchy = "created"
    fields = ("id", "prefix", "principal_type", "principal", "created", "expires_at", "revoked_at", "last_used_at", "audit")
    list_select_related = ("customer", "merchant", "terminal", "staff__user")
    staff_actions = (
        StaffAction("rotate", "Rotate key", "wallets.issue_apikey", RotateForm, _rotate,
                    description="A new key now (shown once); the old one keeps working for the overlap.", audit=False, show=_live),
        StaffAction("revoke", "Revoke key", "wallets.manage_apikey", StaffActionForm,
                    lambda request, obj, data: f"Key {api_key_revoke(api_key=obj).pk} revoked", description="The key stops working now.",
                    audit=False, show=_live),
    )

    @admin.display(description="principal")
    def principal(self, obj: ApiKey) -> str:
        return link(obj.customer or obj.merchant or obj.terminal or obj.staff)

    audit = staticmethod(_audit_column("api_key"))


# --- Payments and refunds -------------------------------------------------------------------


class RefundInline(ReadOnlyMixin, admin.TabularInline):  # type: ignore[type-arg]
    model = Refund
    fields = ("refund_link", "amount_display", "fee", "reason", "created")

    amount_display = staticmethod(_refund_amount)

    @admin.display(description="refund")
    def refund_link(self, obj: Refund) -> str:
        return link(obj)


class RefundForm(StaffActionForm):
    amount = forms.IntegerField(min_value=1, help_text="In the asset's minor units; at most what is left to refund.")
    reason = forms.CharField(max_length=500, required=False, widget=forms.Textarea(attrs={"rows": 2, "cols": 60}))


def _refund(obj: Payment, data: dict[str, Any]) -> str:
    refund = refund_create(payment=obj, amount=data["amount"], reason=data["reason"])
    return f"Refund {refund.pk} of {money(refund.amount, obj.asset)} on {obj.pk}"


@admin.register(Payment)
class PaymentAdmin(StaffActionsMixin, ReadOnlyAdmin):
    list_display = ("id", "created", money_column("amount"), money_column("fee"), money_column("amount_refunded", description="refunded"),
                    "status", link_column("customer"), link_column("merchant"), "store_id")
    # No list filters: status has one value and asset has no index of its own (a rare asset
    # would walk the whole table); the date drill-down and id search use indexes.
    # Exact ids only: each is an index lookup (pk; merchant, store and customer indexes).
    id_search = {"pay": "id", "cus": "customer_id", "mer": "merchant_id", "sto": "store_id", "txn": "ledger_transaction_id"}
    date_hierarchy = "created"
    list_select_related = ("asset", "customer", "merchant")
    fields = ("id", "status", "created", "amount_display", "fee_display", "refunded_display", "rewards", "customer_link", "merchant_link",
              "store_link", "terminal_link", "ledger", "events", "audit")
    inlines = [RefundInline]
    customer_link = staticmethod(link_column("customer"))
    merchant_link = staticmethod(link_column("merchant"))
    store_link = staticmethod(link_column("store"))
    terminal_link = staticmethod(link_column("terminal"))
    ledger = staticmethod(link_column("ledger_transaction"))
    amount_display = staticmethod(money_column("amount"))
    events = staticmethod(_events)
    audit = staticmethod(_audit_column("payments.payment"))
    staff_actions = (
        StaffAction("refund", "Refund", "payments.refund_payment", RefundForm, lambda request, obj, data: _refund(obj, data),
                    description="Refund part or all of this payment through the same service as the API: merchant to customer, rewards"
                    " returned in proportion, and the fee under the tenant's refund fee policy.", show=lambda obj: obj.amount_refundable > 0),
    )

    @admin.display(description="fee")
    def fee_display(self, obj: Payment) -> str:
        net, back = money(obj.net, obj.asset), money(obj.fee_refunded, obj.asset)
        return f"{money(obj.fee, obj.asset)} (net to the merchant: {net}; given back by refunds: {back})"

    @admin.display(description="refunded")
    def refunded_display(self, obj: Payment) -> str:
        return f"{money(obj.amount_refunded, obj.asset)} (left: {money(obj.amount_refundable, obj.asset)})"

    @admin.display(description="rewards")
    def rewards(self, obj: Payment) -> str:
        return f"{obj.points_earned - obj.points_reversed} pt, {obj.carbon_grams - obj.carbon_grams_reversed} g CO₂ (net of refunds)"



@admin.register(Refund)
class RefundAdmin(ReadOnlyAdmin):
    list_display = ("id", "created", "amount_display", link_column("payment"), "reason")
    id_search = {"ref": "id", "pay": "payment_id"}
    date_hierarchy = "created"
    list_select_related = ("payment__asset",)
    fields = ("id", "status", "created", "amount_display", "fee", "payment_link", "reason", "points_reversed", "carbon_grams_reversed",
              "ledger")
    payment_link = staticmethod(link_column("payment"))
    ledger = staticmethod(link_column("ledger_transaction"))
    amount_display = staticmethod(_refund_amount)


@admin.register(Transfer)
class TransferAdmin(ReadOnlyAdmin):
    list_display = ("id", "created", money_column("amount"), link_column("from_customer"), link_column("to_customer"),
                    link_column("ledger_transaction"))
    list_filter = ("asset",)
    id_search = {"trf": "id", "cus": "from_customer_id"}
    date_hierarchy = "created"
    list_select_related = ("asset", "from_customer", "to_customer", "ledger_transaction")


class OperatorQueueFilter(admin.SimpleListFilter):
    title = "operator queue"
    parameter_name = "operator_queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("waiting", "Waiting for an operator"), ("settled", "Settled after review")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[TopUp]) -> QuerySet[TopUp]:
        if self.value() == "waiting":
            return queryset.filter(status=TopUpStatus.PENDING, operator_review_at__isnull=False)
        if self.value() == "settled":
            return queryset.filter(operator_review_at__isnull=False).exclude(status=TopUpStatus.PENDING)
        return queryset


class SettleFromPspForm(StaffActionForm):
    reason = forms.CharField(max_length=500, widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
                             help_text="Why now, for the audit log.")


def _in_operator_queue(obj: TopUp) -> bool:
    return obj.status == TopUpStatus.PENDING and obj.operator_review_at is not None


def _settle_from_psp(obj: TopUp, data: dict[str, Any]) -> str:
    topup, refusal = topup_review_settle(topup_id=obj.pk, reason=data["reason"])
    if topup.failure_code == "not_charged":
        return f"The PSP holds no successful charge for {topup.pk}: it failed ({topup.failure_code}), nothing to credit or refund"
    if refusal is not None:
        return f"Charge {topup.psp_reference} recorded; the credit was refused ({refusal.code}): the card is refunded by the recovery"
    return f"Charge {topup.psp_reference} recorded; {money(topup.amount + topup.bonus_amount, topup.asset)} credited"


def _fail_refunding(obj: TopUp, data: dict[str, Any]) -> str:
    topup = topup_review_fail_refunding(topup_id=obj.pk, reason=data["reason"])
    return (f"{topup.pk} failed ({topup.failure_code}); the PSP's charge {topup.psp_reference} of {topup.psp_charged_amount}"
            f" {topup.psp_charged_currency} (minor units) is refunded by the recovery")


@admin.register(TopUp)
class TopUpAdmin(StaffActionsMixin, ReadOnlyAdmin):
    """Card top-ups. The operator queue (filter "operator queue"): pending top-ups past the
    PSP's idempotency-key window, which a person settles from the PSP's records."""

    list_display = ("id", "created", money_column("amount"), money_column("bonus_amount", description="bonus"), "status",
                    link_column("customer"), "payment_method", "psp_reference", "review", link_column("ledger_transaction"))
    list_filter = (OperatorQueueFilter, "status", "asset")
    id_search = {"top": "id", "cus": "customer_id"}
    search_fields = ("=psp_reference",)
    date_hierarchy = "created"
    list_select_related = ("asset", "customer", "ledger_transaction")
    fields = ("id", "status", "failure_code", "review", "created", "updated", "amount_display", "customer_link", "payment_method",
              "gateway", "psp_lookup", "psp_reference", "psp_charged", "psp_charged_amount", "psp_charged_currency",
              "psp_charged_at", "psp_refund_reference", "last_error", "claim",
              "ledger", "events", "audit")
    customer_link = staticmethod(link_column("customer"))
    ledger = staticmethod(link_column("ledger_transaction"))
    events = staticmethod(_events)
    audit = staticmethod(_audit_column("payments.topup"))
    staff_actions = (
        StaffAction("settle", "Settle from the PSP's records", "payments.settle_topup", SettleFromPspForm,
                    lambda request, obj, data: _settle_from_psp(obj, data),
                    description="Asks the PSP what it holds for this top-up (by its id in the charge's metadata) and settles by"
                    " that: its one successful charge is recorded and credited (refunded instead if the wallet can no longer take"
                    " it); no successful charge fails the top-up. Nothing you type decides it.", show=_in_operator_queue),
        StaffAction("fail_refund", "Fail it and refund what the PSP charged", "payments.settle_topup", SettleFromPspForm,
                    lambda request, obj, data: _fail_refunding(obj, data),
                    description="For a charge the settlement refuses (another amount or currency): asks the PSP for its one"
                    " successful charge under this top-up's id, fails the top-up without a credit and has the recovery refund"
                    " exactly what the PSP charged. Nothing you type decides the amount.", show=_in_operator_queue),
    )

    @admin.display(description="operator review")
    def review(self, obj: TopUp) -> str:
        if obj.operator_review_at is None:
            return "-"
        if obj.status == TopUpStatus.PENDING:
            return f"waiting since {obj.operator_review_at:%Y-%m-%d %H:%M} UTC"
        return f"settled after review (queued {obj.operator_review_at:%Y-%m-%d %H:%M} UTC)"

    @admin.display(description="amount")
    def amount_display(self, obj: TopUp) -> str:
        return f"{money(obj.amount, obj.asset)} (bonus {money(obj.bonus_amount, obj.asset)})"

    @admin.display(description="at the PSP")
    def psp_lookup(self, obj: TopUp) -> str:
        return f"idempotency key and metadata tally_topup: {obj.pk}; charge of {obj.amount} {obj.asset_id} (minor units)"

    @admin.display(description="claim (idempotency record)")
    def claim(self, obj: TopUp) -> str:
        if not obj.claim_key:
            return "-"
        record = IdempotencyRecord.objects.filter(principal_id=obj.claim_principal_id, key=obj.claim_key).first()
        state = link(record, record.state) if record is not None else "record purged"
        return format_html("{} / {} ({})", obj.claim_principal_id, obj.claim_key, state)



class FeeScheduleForm(StaffActionForm):
    asset = forms.ModelChoiceField(queryset=Asset.objects.all(), to_field_name="code")
    merchant = forms.CharField(max_length=48, required=False, help_text="A merchant's id (mer_...) for its own schedule; empty: tenant-wide.")
    rate = forms.DecimalField(min_value=0, max_value=1, max_digits=FEE_RATE_PLACES + 1, decimal_places=FEE_RATE_PLACES,
                              help_text="Fraction of the amount: 0.029 is 2.9 %.")
    rounding = forms.ChoiceField(choices=FeeRounding.choices, initial=FeeRounding.HALF_EVEN, help_text="How amount x rate is rounded.")
    fixed = forms.IntegerField(min_value=0, initial=0, help_text="Added to every fee, in the asset's minor units.")
    valid_from = forms.DateTimeField(
        required=False, label="Valid from (UTC)",
        help_text="When it starts applying, in UTC; empty: as soon as every process knows it (about 15 s). It applies only to payments from"
        " then on.",
    )

    def clean_asset(self) -> str:
        return str(self.cleaned_data["asset"].code)

    def clean_valid_from(self) -> str | None:  # the confirmation's data is JSON
        valid_from = self.cleaned_data["valid_from"]
        return valid_from.isoformat() if valid_from else None


def _fee_schedule_add(request: HttpRequest, obj: Any, data: dict[str, Any]) -> str:
    merchant = merchant_get(merchant_id=data["merchant"], param="merchant") if data["merchant"] else None
    schedule = fee_schedule_create(
        asset_code=data["asset"], merchant=merchant, rate=data["rate"], rounding=data["rounding"], fixed=data["fixed"],
        valid_from=datetime.fromisoformat(data["valid_from"]) if data["valid_from"] else None,
    )
    return f"Fee schedule {schedule.pk} added: {schedule}"


FEE_SCHEDULE_ADD = StaffAction(
    "fee_schedule_create", "Add fee schedule", "payments.add_feeschedule", FeeScheduleForm, _fee_schedule_add, audit=False,
    description="A schedule is never edited: to change a fee, add a schedule with a later start. A merchant's own schedule beats"
    " the tenant-wide one.",
)


@admin.register(FeeSchedule)
class FeeScheduleAdmin(ReadOnlyAdmin):
    """Fee schedules: added here (finance) or on the admin API, never edited."""

    list_display = ("id", "asset", link_column("merchant"), "rate", "rounding", money_column("fixed"), "valid_from", "created")
    list_filter = ("asset",)
    id_search = {"fee": "id", "mer": "merchant_id"}
    date_hierarchy = "valid_from"
    list_select_related = ("asset", "merchant")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.has_perm(FEE_SCHEDULE_ADD.permission))

    def add_view(self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """The confirmation page of a staff action (its own idempotency key: a double submit adds one)."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        action, back = FEE_SCHEDULE_ADD, reverse("admin:payments_feeschedule_changelist", current_app=self.admin_site.name)
        form, result = staff_form_submit(
            request, action.form, action=action.name, target=tenant_current(), audit=False,
            run=lambda data: action.run(request, None, data),
        )
        if result is not None:
            self.message_user(request, ("Already done: " if result.replayed else "") + result.message, level=messages.SUCCESS)
            return HttpResponseRedirect(back)
        return TemplateResponse(request, "admin/tally/confirm_action.html", {
            **self.admin_site.each_context(request), "title": action.label, "object": "Fee schedules", "opts": self.model._meta,
            "action": action, "form": form, "back_url": back,
        })


@admin.register(Adjustment)
class AdjustmentAdmin(ReadOnlyAdmin):
    list_display = ("id", "created", "direction", money_column("amount"), "party", "staff", "reason", link_column("ledger_transaction"))
    list_filter = ("direction", "asset")
    id_search = {"adj": "id", "cus": "customer_id", "mer": "merchant_id"}
    date_hierarchy = "created"
    list_select_related = ("asset", "customer", "merchant", "staff__user", "ledger_transaction")

    @admin.display(description="customer / merchant")
    def party(self, obj: Adjustment) -> str:
        return link(obj.customer or obj.merchant)


def _reject(request: HttpRequest, obj: PendingAdjustment, data: dict[str, Any]) -> str:
    return f"{pending_adjustment_reject(pending=obj, checker=staff_of(request), reason=data['reason']).pk} rejected"


def _pending(obj: PendingAdjustment) -> bool:
    return obj.status == PendingAdjustmentStatus.PENDING


@admin.register(PendingAdjustment)
class PendingAdjustmentAdmin(StaffActionsMixin, ReadOnlyAdmin):
    """Maker-checker: adjustments above the threshold wait here for a second staff member."""

    list_display = ("id", "created", "status", "direction", money_column("amount"), "party", "maker", "checker", "reason",
                    link_column("adjustment"))
    list_filter = ("status", "direction", "asset")
    id_search = {"padj": "id", "cus": "customer_id", "mer": "merchant_id"}
    date_hierarchy = "created"
    list_select_related = ("asset", "customer", "merchant", "maker__user", "checker__user", "adjustment")
    staff_actions = (
        StaffAction("approve", "Approve and post", "payments.approve_pendingadjustment", OptionalReasonForm,
                    lambda request, obj, data: f"Adjustment {pending_adjustment_approve(pending=obj, checker=staff_of(request)).pk} posted",
                    description="Posts the adjustment. You cannot approve your own proposal.", audit=False, show=_pending),
        StaffAction("reject", "Reject", "payments.approve_pendingadjustment", OptionalReasonForm,
                    lambda request, obj, data: _reject(request, obj, data), audit=False, show=_pending),
    )

    @admin.display(description="customer / merchant")
    def party(self, obj: PendingAdjustment) -> str:
        return link(obj.customer or obj.merchant)


@admin.register(PaymentIntent)
class PaymentIntentAdmin(ReadOnlyAdmin):
    list_display = ("id", "created", "status", money_column("amount"), money_column("amount_captured", description="captured"),
                    "capture_method", link_column("merchant"), link_column("customer"), link_column("payment"))
    list_filter = ("status", "capture_method", "asset")
    id_search = {"pi": "id", "mer": "merchant_id", "cus": "customer_id", "pay": "payment_id"}
    date_hierarchy = "created"
    list_select_related = ("asset", "merchant", "customer", "payment")


@admin.register(PaymentToken)
class PaymentTokenAdmin(ReadOnlyAdmin):
    """Payment tokens: never the token (only its id; the hash is not shown either)."""

    list_display = ("id", link_column("customer"), "created", "expires_at", "used_at")
    list_filter = (("used_at", admin.EmptyFieldListFilter),)
    id_search = {"ptk": "id", "cus": "customer_id"}
    date_hierarchy = "created"
    fields = ("id", "customer", "created", "expires_at", "used_at")
    list_select_related = ("customer",)


@admin.register(Mandate)
class MandateAdmin(ReadOnlyAdmin):
    list_display = ("id", link_column("customer"), link_column("merchant"), "created", "revoked_at")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    id_search = {"mnd": "id", "cus": "customer_id", "mer": "merchant_id"}
    date_hierarchy = "created"
    list_select_related = ("customer", "merchant")


@admin.register(GatewayAccount)
class GatewayAccountAdmin(ReadOnlyAdmin):
    """The tenant's card gateways; the credentials are sealed and never shown (set them with
    `manage.py gateway_account_set`)."""

    list_display = ("gateway", "active", "api_base", "created", "updated")
    list_filter = ("gateway", "active")
    fields = ("gateway", "active", "api_base", "created", "updated")


@admin.register(PspWebhookEvent)
class PspWebhookEventAdmin(ReadOnlyAdmin):
    """Inbound PSP events, each recorded with its effect (a redelivery is a no-op)."""

    list_display = ("event_id", "gateway", "type", "outcome", "received")
    list_filter = ("gateway", "outcome", "type")
    search_fields = ("=event_id",)
    date_hierarchy = "received"


class PayoutQueueFilter(admin.SimpleListFilter):
    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("review", "Waiting for an operator"), ("overdue", "In transit past the PSP's promise"), ("approval", "Waiting for approval"),
                ("unsent", "Pending, not sent"), ("returning", "Failed at the PSP, money not yet taken back")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Payout]) -> QuerySet[Payout]:
        from django.utils import timezone

        if self.value() == "review":
            return queryset.filter(review_at__isnull=False)
        if self.value() == "returning":
            return queryset.filter(return_owed_at__isnull=False, review_at__isnull=True)
        if self.value() == "overdue":
            return queryset.filter(status=PayoutStatus.IN_TRANSIT, arrival_expected_at__lt=timezone.now())
        if self.value() == "approval":
            return queryset.filter(status=PayoutStatus.PENDING, approval_required=True, approved_at__isnull=True)
        if self.value() == "unsent":
            return queryset.filter(status=PayoutStatus.PENDING, attempts=0)
        return queryset


def _approve(request: HttpRequest, obj: Payout, data: dict[str, Any]) -> str:
    payout = payout_approve(payout=obj, staff=staff_of(request))
    if payout.approved_at is None:
        return f"{payout.pk}: your approval is recorded; it is over what you may approve alone, so a second staff member must approve it"
    return f"{payout.pk} approved: it is sent to the PSP"


def _stop_prepare(request: HttpRequest, obj: Payout, data: dict[str, Any]) -> dict[str, Any]:
    return {"facts": payout_review_stop_prepare(payout=obj)}  # the PSP's read, before the confirmation's transaction


def _stop(request: HttpRequest, obj: Payout, data: dict[str, Any]) -> str:
    payout = payout_review_stop(payout=obj, staff=staff_of(request), reason=data["reason"], facts=data["facts"])
    return f"{payout.pk} waits for an operator: {payout.review_reason}"


def _resolver(outcome: str) -> Callable[[HttpRequest, Payout, dict[str, Any]], str]:
    def resolve(request: HttpRequest, obj: Payout, data: dict[str, Any]) -> str:
        payout = payout_review_resolve(payout=obj, staff=staff_of(request), outcome=outcome, reason=data["reason"])
        if payout.review_at is not None:
            return f"{payout.pk}: marking it {outcome} is proposed; a second staff member confirms it"
        if payout.return_owed_at is not None:
            return (f"{payout.pk} resolved failed: the PSP is asked to take back what it sent on; the funds go back to the merchant"
                    " once it has (a refusal puts the payout back in the operator queue)")
        return f"{payout.pk} resolved: {payout.status}" + (" (the funds are back with the merchant)" if outcome == "failed" else "")

    return resolve


def _stoppable(obj: Payout) -> bool:
    return obj.review_at is None and (obj.status == PayoutStatus.IN_TRANSIT or (obj.status == PayoutStatus.PENDING and obj.attempts > 0))


@admin.register(Payout)
class PayoutAdmin(StaffActionsMixin, ReadOnlyAdmin):
    """Payouts. The queues (filter "queue"): waiting for an operator (the operator queue,
    resolved by two staff members), in transit past the PSP's promise, waiting for
    approval, pending and never sent (held), failed at the PSP with the money not yet taken back."""

    list_display = ("id", "created", "status", money_column("amount"), link_column("merchant"), "origin", "psp_reference",
                    "arrival_expected_at", "approval", "review")
    list_filter = (PayoutQueueFilter, "status", "origin", "asset")
    id_search = {"po": "id", "mer": "merchant_id"}
    search_fields = ("=psp_reference",)
    date_hierarchy = "created"
    list_select_related = ("asset", "merchant")
    fields = ("id", "status", "failure_code", "created", "updated", "settled_at", "amount_display", "merchant_link", "origin",
              "schedule_day", "retry_of_link", "bank_account", "gateway", "psp_reference", "psp_created_at", "arrival_expected_at",
              "psp_checked_at", "approval", "approval_reason", "review", "review_reason", "return_owed", "attempts", "fence",
              "lease_expires_at", "last_error", "ledger", "paid_ledger", "returned_ledger", "events", "audit")
    amount_display = staticmethod(money_column("amount"))
    merchant_link = staticmethod(link_column("merchant"))
    retry_of_link = staticmethod(link_column("retry_of"))
    ledger = staticmethod(link_column("ledger_transaction"))
    paid_ledger = staticmethod(link_column("paid_transaction"))
    returned_ledger = staticmethod(link_column("returned_transaction"))
    events = staticmethod(_events)
    audit = staticmethod(_audit_column("payout"))
    staff_actions = (
        StaffAction("approve", "Approve", "payments.approve_payout", OptionalReasonForm, _approve,
                    description="Sends it to the PSP. It counts into what you post alone (with adjustments); over your limit a second"
                    " staff member must approve it too. You cannot approve what you proposed.", audit=False,
                    show=lambda obj: obj.awaiting_approval),
        StaffAction("cancel", "Cancel", "payments.manage_payouts", ReasonForm,
                    lambda request, obj, data: f"{payout_cancel(payout=obj, reason=data['reason']).pk} canceled: the funds are back with"
                    " the merchant", description="Only a payout the PSP was never asked to make.", audit=False,
                    show=lambda obj: obj.status == PayoutStatus.PENDING and obj.attempts == 0),
        StaffAction("retry", "Retry", "payments.approve_payout", OptionalReasonForm,
                    lambda request, obj, data: f"Retry {payout_retry(payout=obj, staff=staff_of(request)).pk} made",
                    description="A new payout of this amount from the merchant's available funds to its bank account as it is now."
                    " Money leaves on your word: it counts into what you post alone, beyond it a second staff member approves.",
                    audit=False, show=lambda obj: obj.status == PayoutStatus.FAILED),
        StaffAction("stop", "Stop for an operator", "payments.resolve_payout", ReasonForm, _stop,
                    description="For a payout the PSP cannot settle (it never heard of it, or keeps failing to answer) once no send is"
                    " under way: the PSP is asked first (one that holds it as ours is refused: the saga settles it), then the"
                    " recovery leaves it alone and it waits in the operator queue to be marked paid or failed. Refused if the"
                    " payout moved on while the PSP was asked.", audit=False, show=_stoppable, prepare=_stop_prepare),
        *(StaffAction(f"resolve_{outcome}", f"Mark {outcome}", "payments.resolve_payout", ReasonForm, _resolver(outcome),
                      description=("The money left for the bank account: in transit -> the PSP settlement account. Only once the"
                                   " PSP's records say it was paid." if outcome == "paid" else
                                   "The money never reached the bank account. For a payout the PSP may have, Tally asks the PSP"
                                   " to take back what it sent on (a Connect transfer reversed) and gives the money back to the"
                                   " merchant only once it has; a refusal puts it back in this queue. A payout failed here already"
                                   " (the PSP says it sent it) moves no money: settle that with the merchant first.")
                      + " Two staff members: the first proposes, a second confirms; the proposer cannot confirm.",
                      audit=False, show=lambda obj: obj.review_at is not None) for outcome in REVIEW_OUTCOMES),
    )

    @admin.display(description="operator queue")
    def review(self, obj: Payout) -> str:
        if obj.review_at is not None:
            proposed = f"; {obj.review_maker_id} proposes {obj.review_outcome}" if obj.review_maker_id else ""
            return f"waiting since {obj.review_at:%Y-%m-%d %H:%M} UTC{proposed}"
        if obj.review_resolved_at is not None:
            return f"resolved {obj.review_resolved_at:%Y-%m-%d %H:%M} UTC by {obj.review_maker_id} and {obj.review_resolved_by_id}"
        return "-"

    @admin.display(description="money owed back by the PSP")
    def return_owed(self, obj: Payout) -> str:
        if obj.return_owed_at is None:
            return "-"
        return f"since {obj.return_owed_at:%Y-%m-%d %H:%M} UTC ({obj.return_failure_code}): the recovery asks the PSP to take it back"

    @admin.display(description="bank account")
    def bank_account(self, obj: Payout) -> str:
        return f"•••• {obj.destination_last4} ({obj.destination})"

    @admin.display(description="approval")
    def approval(self, obj: Payout) -> str:
        if not obj.approval_required:
            return "-"
        if obj.approved_at is not None:
            return f"approved by {obj.approved_by_id}" + (f" after {obj.approval_maker_id}" if obj.approval_maker_id else "")
        return "waiting" + (f" for a second staff member (first: {obj.approval_maker_id})" if obj.approval_maker_id else "")


@admin.register(MerchantBankAccount)
class MerchantBankAccountAdmin(ReadOnlyAdmin):
    """Where merchants' payouts go: the PSP's reference and the last four digits only."""

    list_display = (link_column("merchant"), "gateway", "psp_reference", "last4", "changed_at")
    list_filter = ("gateway",)
    id_search = {"mer": "merchant_id"}
    list_select_related = ("merchant",)


def _topup_queue_panel() -> SafeString:
    """The platform admin's view of a tenant's card money still in flight (the tenant's
    own admin may be unreachable: a switched-off tenant's hosts answer 404)."""
    queue = topup_queue(limit=TOPUP_QUEUE_SHOWN)
    if not (queue.pending or queue.refunds_owed):
        return format_html("<p>{}</p>", "No card top-up pending, no card refund owed.")
    rows = format_html_join(
        "", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        (
            (t.pk, f"{t.created:%Y-%m-%d %H:%M}", money(t.amount, t.asset), _queue_state(t), t.gateway, t.psp_reference or "-",
             t.last_error or "-")
            for t in queue.oldest
        ),
    )
    shown = len(queue.oldest)
    return format_html(
        "<p>{} pending ({} waiting for an operator), {} card refunds owed; the oldest {} below. Recovery and refunds run"
        " whether or not the tenant is switched on.</p><table><thead><tr><th>top-up</th><th>created (UTC)</th><th>amount</th>"
        "<th>state</th><th>gateway</th><th>PSP charge</th><th>last error</th></tr></thead><tbody>{}</tbody></table>",
        queue.pending, queue.operator_review, queue.refunds_owed, shown, rows,
    )


def _queue_state(topup: TopUp) -> str:
    if topup.status == TopUpStatus.FAILED:
        return f"refund owed ({topup.failure_code})"
    if topup.operator_review_at is not None:
        return f"operator queue since {topup.operator_review_at:%Y-%m-%d %H:%M}"
    return "pending"


TOPUP_QUEUE_SHOWN = 50
tenant_panel_register(title="Card top-ups", render=_topup_queue_panel)


def _payouts_overdue_panel() -> SafeString:
    """The platform admin's view of a tenant's payouts in transit past the PSP's promise."""
    from django.utils import timezone

    overdue = list(payouts_in_transit_overdue(now=timezone.now()).select_related("asset"))
    if not overdue:
        return format_html("<p>{}</p>", "No payout in transit past the PSP's promise.")
    rows = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", (
        (p.pk, p.merchant_id, money(p.amount, p.asset), f"{p.arrival_expected_at:%Y-%m-%d %H:%M}", p.psp_reference) for p in overdue
    ))
    return format_html(
        "<p>The oldest {} payouts in transit past the PSP's promise (the recovery asks the PSP about each hourly).</p><table><thead><tr>"
        "<th>payout</th><th>merchant</th><th>amount</th><th>promised (UTC)</th><th>PSP payout</th></tr></thead><tbody>{}</tbody></table>",
        len(overdue), rows,
    )


tenant_panel_register(title="Payouts in transit too long", render=_payouts_overdue_panel)


def _payouts_review_panel() -> SafeString:
    """The platform admin's view of a tenant's operator queue of payouts."""
    waiting = list(payouts_in_review().select_related("asset")[:PAYOUT_QUEUE_SHOWN])
    if not waiting:
        return format_html("<p>{}</p>", "No payout waits for an operator.")
    rows = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", (
        (p.pk, p.merchant_id, money(p.amount, p.asset), p.status, f"{p.review_at:%Y-%m-%d %H:%M}", p.review_reason) for p in waiting
    ))
    return format_html(
        "<p>The oldest {} payouts waiting for an operator (two staff members mark each paid or failed in the tenant's admin).</p>"
        "<table><thead><tr><th>payout</th><th>merchant</th><th>amount</th><th>status</th><th>since (UTC)</th><th>why</th></tr></thead>"
        "<tbody>{}</tbody></table>",
        len(waiting), rows,
    )


PAYOUT_QUEUE_SHOWN = 50
tenant_panel_register(title="Payouts waiting for an operator", render=_payouts_review_panel)
