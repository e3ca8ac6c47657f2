"""Customer face (`ck_` keys): the customer's own wallet, history, tokens, transfers,
top-ups, payments and refunds. Routed by config/api_urls.py."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from django.http import HttpResponse
from django.http.response import HttpResponseBase
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from apikit.base import CustomerViewSet
from apikit.idempotency import request_id_of
from apikit.pagination import ListParamsSerializer
from apikit.schema import ErrorSerializer
from apikit.viewsets import CreateMixin, ListMixin, RetrieveMixin, object_action
from idempotency.engine import IdempotencyContext
from idempotency.errors import IdempotencyKeyMissing
from payments import selectors as payment_selectors
from payments.api import serializers as s
from payments.api.statements import StatementMixin, statement_schema
from payments.models import Mandate, Payment, Refund, Transfer
from payments.services import mandates, tokens, topup_saga, topups, transfers
from payments.statements import Viewer, statement_account_get
from wallets import selectors as wallet_selectors
from wallets.books import account_balance_lines_at
from wallets.contacts import customer_contact_attach
from wallets.models import Account, LedgerEntry
from wallets.services import contacts as contact_services

TAG = ["customer"]


class WalletViewSet(CustomerViewSet):
    @extend_schema(
        tags=TAG, summary="Wallet balances per asset (available = balance - held), now or as of an instant (`at`)",
        description="With `at`: each asset's `balance` as of that instant, from the ledger (`available` and `held` null); an asset"
        " the wallet holds now but did not then answers 0. A malformed `at`, one without an offset, or one in the future: 400.",
        parameters=[s.BalanceAtParams], responses=s.WalletOut,
    )
    def list(self, request: Request) -> Response:
        customer = self.customer
        at = self.query(s.BalanceAtParams).get("at")
        account = wallet_selectors.customer_get(customer_id=customer.pk).account
        if at is None:
            balances: list[Any] = list(payment_selectors.wallet_balances(customer=customer))
        else:
            balances = [{**line, "available": None, "held": None} for line in account_balance_lines_at(account_id=account.pk, at=at)]
        return self.render(s.WalletOut, {"customer": customer.pk, "frozen": account.frozen, "at": at, "balances": balances})


class ContactViewSet(CustomerViewSet):
    @extend_schema(tags=TAG, summary="The customer's own email and phone", responses=s.ContactOut)
    def list(self, request: Request) -> Response:
        return self.render(s.ContactOut, customer_contact_attach(customer=wallet_selectors.customer_get(customer_id=self.customer.pk)))

    @extend_schema(
        tags=TAG, summary="Set, clear or keep the customer's email and phone (a field left out is unchanged; null clears it)",
        request=s.ContactUpdateIn, responses={200: s.ContactOut},
    )
    def create(self, request: Request) -> Response:
        data = self.validated(s.ContactUpdateIn)
        contact_services.customer_contact_update(customer_id=self.customer.pk, **data)
        return self.render(s.ContactOut, customer_contact_attach(customer=wallet_selectors.customer_get(customer_id=self.customer.pk)))


class TransactionViewSet(ListMixin, CustomerViewSet):
    out, list_params = s.TransactionOut, s.AssetListParams
    summaries = {"list": "Wallet history (ledger entries), newest first"}

    def objects(self, params: dict[str, Any]) -> QuerySet[LedgerEntry]:
        return payment_selectors.ledger_entries_for_customer(
            customer=self.customer, asset_code=params.get("asset"), created_gte=params.get("created_gte"), created_lt=params.get("created_lt")
        )


class PaymentTokenViewSet(CreateMixin, CustomerViewSet):
    idempotency_response_contains_secret = True  # the answer holds the token
    out, create_in = s.PaymentTokenOut, s.EmptyIn
    summaries = {"create": "Mint a short-lived payment token for the terminal's QR scan"}

    def object_create(self, data: dict[str, Any]) -> dict[str, Any]:
        token, raw = tokens.payment_token_create(customer=self.customer)
        return {"token": raw, "expires_at": token.expires_at}


class TransferViewSet(ListMixin, CreateMixin, RetrieveMixin, CustomerViewSet):
    lookup_url_kwarg = "transfer_id"
    out, create_in = s.TransferOut, s.TransferCreateIn
    summaries = {"list": "Transfers sent or received", "create": "Send money to another customer", "retrieve": "Retrieve a transfer sent or received"}

    def objects(self, params: dict[str, Any]) -> QuerySet[Transfer]:
        return payment_selectors.transfers_list(customer_id=self.customer.pk)

    def object_create(self, data: dict[str, Any]) -> Transfer:
        to_customer = wallet_selectors.customer_get(customer_id=data["to_customer"], param="to_customer")
        return transfers.transfer_create(from_customer=self.customer, to_customer=to_customer, asset_code=data["asset"], amount=data["amount"])

    def object_get(self, transfer_id: str) -> Transfer:
        return payment_selectors.transfer_get(transfer_id=transfer_id, customer_id=self.customer.pk)


class TopUpViewSet(CustomerViewSet):
    """Card top-ups: an external effect (payments/services/topup_saga.py)."""

    lookup_url_kwarg = "topup_id"
    idempotency_effect = "external"
    idempotency_mint = {topup_saga.MINT_NAME: "top"}

    def idempotency_lease_for(self) -> int | None:
        return int(settings.TALLY_TOPUP_LEASE_SECONDS)

    def idempotency_on_claim(self, ctx: IdempotencyContext) -> None:
        data = self.validated(s.TopUpCreateIn)
        topups.topup_pending_ensure(
            topup_id=ctx.minted[topup_saga.MINT_NAME], customer=self.customer, asset_code=data["asset"], amount=data["amount"],
            payment_method=data["payment_method"], claim_principal_id=ctx.principal_id, claim_key=str(ctx.key),
        )

    def idempotency_on_release(self, ctx: IdempotencyContext) -> None:
        # Only a first attempt knows the card was never charged: a retry of the key may
        # follow an attempt whose charge went through unanswered, so its top-up stays
        # pending for the recovery (or the operator queue) to settle from the PSP.
        if not ctx.takeover:
            topups.topup_abandon(topup_id=ctx.minted[topup_saga.MINT_NAME])

    @extend_schema(tags=TAG, summary="Card top-ups", parameters=[ListParamsSerializer], responses=s.TopUpList)
    def list(self, request: Request) -> Response:
        self.query(ListParamsSerializer)
        return self.list_response(payment_selectors.topups_list(customer_id=self.customer.pk), s.TopUpOut)

    @extend_schema(
        tags=TAG, summary="Top up the wallet by card (main or regional currency)", request=s.TopUpCreateIn,
        description=(
            "Charges the card at the operator's PSP with the top-up id as the PSP's idempotency key, then credits the wallet "
            "(plus the operator's top-up bonus) in the transaction that stores the answer. Requires an Idempotency-Key. "
            "A 402 `psp_refused` means the PSP refused the request itself (e.g. an amount below its minimum): nothing was "
            "charged and the top-up has failed. A 503 `psp_unavailable` means the PSP's answer is unknown: retry with the same "
            "key (it never charges twice); the top-up also converges on its own (PSP webhook, recovery task)."
        ),
        responses={
            201: OpenApiResponse(s.TopUpOut, description="Charged and credited."),
            400: OpenApiResponse(ErrorSerializer, description="Invalid request, e.g. `asset_not_top_upable` (points, carbon credits)."),
            402: OpenApiResponse(
                ErrorSerializer, description="`card_declined`, `psp_refused`, `cap_exceeded` or `wallet_frozen` (stored and replayed)."
            ),
            503: OpenApiResponse(ErrorSerializer, description="`psp_unavailable`: outcome unknown, retry with the same key (Retry-After)."),
        },
    )
    def create(self, request: Request) -> HttpResponseBase:
        ctx = self.idempotency
        if ctx.key is None:
            raise IdempotencyKeyMissing("card top-ups require an Idempotency-Key header")
        settle = topup_saga.topup_saga_charge(topup_id=ctx.minted[topup_saga.MINT_NAME], first_attempt=not ctx.takeover)
        request_id = request_id_of(request)

        def answer() -> HttpResponse:
            topup, refusal = settle()
            stored = topup_saga.topup_answer(topup=topup, refusal=refusal, request_id=request_id)
            return HttpResponse(stored.body, status=stored.status, content_type=stored.headers["Content-Type"])

        return self.idempotency_finish(answer)

    @extend_schema(tags=TAG, summary="Retrieve a top-up", responses=s.TopUpOut)
    def retrieve(self, request: Request, topup_id: str) -> Response:
        return self.render(s.TopUpOut, payment_selectors.topup_get(topup_id=topup_id, customer_id=self.customer.pk))


class PaymentViewSet(ListMixin, RetrieveMixin, CustomerViewSet):
    lookup_url_kwarg = "payment_id"
    out, list_params = s.CustomerPaymentOut, s.AssetListParams
    summaries = {"list": "The customer's payments", "retrieve": "Retrieve one of the customer's payments"}

    def objects(self, params: dict[str, Any]) -> QuerySet[Payment]:
        return payment_selectors.payments_list(customer_id=self.customer.pk, asset_code=params.get("asset"))

    def object_get(self, payment_id: str) -> Payment:
        return payment_selectors.payment_get(payment_id=payment_id, customer_id=self.customer.pk)


class RefundViewSet(ListMixin, RetrieveMixin, CustomerViewSet):
    lookup_url_kwarg = "refund_id"
    out = s.CustomerRefundOut
    summaries = {"list": "Refunds of the customer's payments", "retrieve": "Retrieve a refund of one of the customer's payments"}

    def objects(self, params: dict[str, Any]) -> QuerySet[Refund]:
        return payment_selectors.refunds_list(customer_id=self.customer.pk)

    def object_get(self, refund_id: str) -> Refund:
        return payment_selectors.refund_get(refund_id=refund_id, customer_id=self.customer.pk)


class MandateViewSet(ListMixin, CreateMixin, RetrieveMixin, CustomerViewSet):
    """The customer's standing consents: a merchant with one may charge them by customer id."""

    lookup_url_kwarg = "mandate_id"
    out, create_in = s.MandateOut, s.MandateCreateIn
    summaries = {
        "list": "Mandates the customer has granted", "create": "Let a merchant charge the customer by customer id (a standing mandate)",
        "retrieve": "Retrieve a mandate",
    }

    def objects(self, params: dict[str, Any]) -> QuerySet[Mandate]:
        return payment_selectors.mandates_list(customer_id=self.customer.pk)

    def object_create(self, data: dict[str, Any]) -> Mandate:
        merchant = wallet_selectors.merchant_get(merchant_id=data["merchant"], param="merchant")
        return mandates.mandate_grant(customer=self.customer, merchant=merchant)

    def object_get(self, mandate_id: str) -> Mandate:
        return payment_selectors.mandate_get(mandate_id=mandate_id, customer_id=self.customer.pk)

    @object_action(TAG, summary="Revoke a mandate: the merchant's next charge by customer id is refused", body=s.EmptyIn, out=s.MandateOut)
    def revoke(self, mandate: Mandate, data: dict[str, Any]) -> Mandate:
        return mandates.mandate_revoke(mandate=mandate)


# --- Statements (payments/api/statements.py) -------------------------------------------


class StatementViewSet(StatementMixin, CustomerViewSet):
    viewer = Viewer.CUSTOMER

    def statement_account(self) -> tuple[Account, str, str]:
        return statement_account_get(customer_id=self.customer.pk)

    @statement_schema(TAG[0])
    def list(self, request: Request) -> HttpResponseBase:
        return self.statement()
