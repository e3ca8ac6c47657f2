"""The back office's statements: any customer's or merchant's statement, downloaded as CSV
(streamed) or PDF from a button on its page. The period's rules are the API's
(payments.api.statements.StatementParams); staff see both parties' ids and names and every fee.

Who may: any staff login that may view the party and the ledger (every role: each sees the
ledger already, wallets.services.roles). A download is audited (`statement.download`, the
party, the period): it hands a party's whole history out of the back office.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from payments import statements
from payments.api.statements import StatementParams, pdf_too_long_message
from payments.statement_files import statement_csv_rows, statement_filename, statement_pdf
from payments.statements import Viewer, statement_account_get, statement_head, statement_line_count_exceeds, statement_lines
from tenants.selectors import tenant_zone
from wallets.models import Asset, Customer
from wallets.services.audit import audit_record

LEDGER_VIEW = "wallets.view_ledgerentry"


class StatementForm(forms.Form):
    asset = forms.ChoiceField(choices=())
    month = forms.CharField(required=False, max_length=7, help_text="YYYY-MM (the tenant's calendar month).")
    start = forms.CharField(required=False, max_length=40, label="From",
                            help_text="Or a range: ISO 8601 with its offset, e.g. 2026-10-01T00:00:00+02:00.")
    end = forms.CharField(required=False, max_length=40, label="To", help_text="Excluded; a longer period than 366 days ends 366 days after From.")
    format = forms.ChoiceField(choices=[("csv", "CSV"), ("pdf", "PDF")])

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        asset = self.fields["asset"]
        assert isinstance(asset, forms.ChoiceField)
        asset.choices = [(code, code) for code in Asset.objects.order_by("code").values_list("code", flat=True)]
        self.params: dict[str, Any] = {}

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        raw = {"asset": data.get("asset"), "month": data.get("month"), "from": data.get("start"), "to": data.get("end"),
               "format": data.get("format")}
        params = StatementParams(data={name: value for name, value in raw.items() if value})
        if not params.is_valid():
            names = {"from": "start", "to": "end"}
            for name, errors in params.errors.items():
                self.add_error(names.get(name, name) if names.get(name, name) in self.fields else None, [str(e) for e in errors])
        else:
            self.params = dict(params.validated_data)
        return data


class StatementDownloadMixin(admin.ModelAdmin):  # type: ignore[type-arg]
    """A "Statement" button on a customer's or merchant's page and its download view."""

    def _statement_url_name(self) -> str:
        return f"{self.model._meta.app_label}_{self.model._meta.model_name}_statement"

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(self.statement_view)
        return [path("<path:object_id>/statement/", view, name=self._statement_url_name()), *super().get_urls()]

    def _staff_actions_for(self, request: HttpRequest, obj: Any) -> list[dict[str, str]]:
        actions: list[dict[str, str]] = super()._staff_actions_for(request, obj)  # type: ignore[misc]
        if request.user.has_perm(LEDGER_VIEW):
            url = reverse(f"admin:{self._statement_url_name()}", args=[quote(obj.pk)], current_app=self.admin_site.name)
            actions.append({"label": "Statement", "url": url})
        return actions

    def statement_view(self, request: HttpRequest, object_id: str) -> HttpResponseBase:
        if not request.user.has_perm(LEDGER_VIEW):
            raise PermissionDenied
        party = self.get_object(request, unquote(object_id))
        if party is None or not self.has_view_or_change_permission(request, party):
            raise Http404("no such object")
        back = reverse(f"admin:{self.model._meta.app_label}_{self.model._meta.model_name}_change", args=[quote(party.pk)],
                       current_app=self.admin_site.name)
        form = StatementForm(request.GET if "download" in request.GET else None)
        if form.is_bound and form.is_valid() and form.params:
            response = _download(party, form.params)
            if response is not None:
                return response
            form.add_error("format", pdf_too_long_message())
        return TemplateResponse(request, "admin/tally/statement.html", {
            **self.admin_site.each_context(request), "title": f"Statement: {party}", "object": party, "opts": self.model._meta,
            "form": form, "back_url": back, "time_zone": str(tenant_zone()),
        })


def _download(party: Any, params: dict[str, Any]) -> HttpResponseBase | None:
    """The file, audited; None for a PDF of more lines than one may hold (the form says so)."""
    is_customer = isinstance(party, Customer)
    account, party_type, name = statement_account_get(**({"customer_id": party.pk} if is_customer else {"merchant_id": party.pk}))
    head = statement_head(account=account, party_type=party_type, party_name=name, asset=Asset.objects.get(code=params["asset"]),
                          start=params["start"], end=params["end"])
    if params["format"] == "pdf" and statement_line_count_exceeds(head=head, limit=statements.PDF_MAX_LINES):
        return None
    audit_record(action="statement.download", target_type=party_type, target_id=party.pk,
                 after={"asset": head.asset.code, "from": head.start.isoformat(), "to": head.end.isoformat(), "format": params["format"]})
    lines = statement_lines(head=head, viewer=Viewer.STAFF)
    response: HttpResponseBase
    if params["format"] == "pdf":
        response = HttpResponse(statement_pdf(head, lines), content_type="application/pdf")
    else:
        response = StreamingHttpResponse(statement_csv_rows(head, lines), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{statement_filename(head, params["format"])}"'
    return response
