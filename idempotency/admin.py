"""Idempotency records in the tenant admin, read-only (SPEC 9): a stuck key is recovered by lease
takeover, not by hand. Also the audited switch of a face's mode, and every staff confirmation."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from idempotency.errors import IdempotencyError
from idempotency.models import IdempotencyRecord
from idempotency.modes import FACES, idempotency_mode_set
from idempotency.staff import StaffActionResult, staff_action_run
from tenants.models import IdempotencyMode
from tenants.selectors import tenant_current
from wallets.adminkit import ReadOnlyAdmin
from wallets.errors import TallyError


class StaffActionForm(forms.Form):
    """Base of every confirmation form: the hidden idempotency key of this confirmation."""

    idempotency_key = forms.CharField(widget=forms.HiddenInput, max_length=255)


def staff_form_submit(
    request: HttpRequest, form_class: type[StaffActionForm], *, action: str, target: Any, run: Callable[[dict[str, Any]], str | tuple[str, str]],
    audit: bool = True, prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> tuple[StaffActionForm, StaffActionResult | None]:
    """A fresh confirmation (a new idempotency key) on GET; on a valid POST, `run(data)` through
    staff_action_run (at most once per key, audited) and its result, or the form with the refusal.
    `prepare(data)` runs first, before the claim's transaction (a read of a PSP, which must not
    hold a transaction open): what it returns is added to the data `run` gets, not to the
    key's fingerprint nor to the audit entry."""
    if request.method != "POST":
        return form_class(initial={"idempotency_key": uuid.uuid4().hex}), None
    form = form_class(request.POST)
    if form.is_valid():
        data = {k: v for k, v in form.cleaned_data.items() if k != "idempotency_key"}
        try:
            prepared = {**data, **prepare(data)} if prepare is not None else data
            return form, staff_action_run(
                user_id=request.user.pk, action=action, target=target, idempotency_key=form.cleaned_data["idempotency_key"], data=data,
                fn=lambda: run(prepared), audit=audit,
            )
        except IdempotencyError as exc:
            # A duplicate is running, or the key was used for other data: keep it (this confirmation acts at most once).
            form.add_error(None, exc.message)
        except TallyError as exc:
            # Refused, nothing done (the claim rolled back): the corrected form gets a fresh key, the old one is bound to this data.
            form = form_class({**request.POST.dict(), "idempotency_key": uuid.uuid4().hex})
            form.is_valid()
            form.add_error(None, exc.message)
    return form, None


class ModeForm(StaffActionForm):
    face = forms.ChoiceField(choices=[(f, f) for f in FACES])
    mode = forms.ChoiceField(choices=IdempotencyMode.choices)
    reason = forms.CharField(max_length=500, widget=forms.Textarea(attrs={"rows": 2, "cols": 60}))


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(ReadOnlyAdmin):
    list_display = ("key", "principal_id", "scope", "state", "response_status", "fence", "created", "completed_at", "request_id")
    list_filter = ("state", "scope", "effect")
    search_fields = ("=key", "=principal_id", "=request_id")
    date_hierarchy = "created"
    readonly_fields = [f.name for f in IdempotencyRecord._meta.fields if f.name not in ("response_body", "response_headers")]
    exclude = ("response_body", "response_headers")  # may hold a sealed secret; never shown
    change_list_template = "admin/tally/idempotency_changelist.html"

    def get_urls(self) -> list[URLPattern]:
        return [path("modes/", self.admin_site.admin_view(self.modes_view), name="idempotency_modes"), *super().get_urls()]

    def modes_view(self, request: HttpRequest) -> HttpResponse:
        if not request.user.has_perm("idempotency.switch_idempotency_mode"):
            raise PermissionDenied
        tenant = tenant_current()
        form, result = staff_form_submit(
            request, ModeForm, action="idempotency_mode_set", target=tenant, audit=False,
            run=lambda data: f"{data['face']}: {idempotency_mode_set(tenant=tenant, **data).idempotency_mode_for(data['face'])}",
        )
        if result is not None:
            self.message_user(request, ("Already done: " if result.replayed else "Idempotency mode set, ") + result.message, level=messages.SUCCESS)
            return HttpResponseRedirect(reverse("admin:idempotency_modes", current_app=self.admin_site.name))
        context: dict[str, Any] = {
            **self.admin_site.each_context(request), "title": "Idempotency mode per face", "opts": self.model._meta, "form": form,
            "modes": [(face, tenant.idempotency_mode_for(face)) for face in FACES],
        }
        return TemplateResponse(request, "admin/tally/idempotency_modes.html", context)
