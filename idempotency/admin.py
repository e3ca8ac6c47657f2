"""Idempotency records in the tenant admin, read-only (SPEC 9): a stuck key is recovered by
lease takeover, not by hand. Also the switch of a face's idempotency mode (audited)."""

from __future__ import annotations

import uuid
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from idempotency.models import IdempotencyRecord
from idempotency.modes import FACES, idempotency_mode_set
from idempotency.staff import staff_action_run
from tenants.models import IdempotencyMode
from tenants.selectors import tenant_current
from wallets.adminkit import ReadOnlyAdmin
from wallets.errors import TallyError


class ModeForm(forms.Form):
    idempotency_key = forms.CharField(widget=forms.HiddenInput, max_length=255)
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
        if request.method == "POST":
            form = ModeForm(request.POST)
            if form.is_valid():
                data = {k: v for k, v in form.cleaned_data.items() if k != "idempotency_key"}
                try:
                    result = staff_action_run(
                        user_id=request.user.pk, action="idempotency_mode_set", target=tenant,
                        idempotency_key=form.cleaned_data["idempotency_key"], data=data, audit=False,
                        fn=lambda: f"{data['face']}: {idempotency_mode_set(tenant=tenant, **data).idempotency_mode_for(data['face'])}",
                    )
                except TallyError as exc:
                    form.add_error(None, exc.message)
                else:
                    self.message_user(request, ("Already done: " if result.replayed else "Idempotency mode set, ") + result.message,
                                      level=messages.SUCCESS)
                    return HttpResponseRedirect(reverse("admin:idempotency_modes", current_app=self.admin_site.name))
        else:
            form = ModeForm(initial={"idempotency_key": uuid.uuid4().hex})
        context: dict[str, Any] = {
            **self.admin_site.each_context(request), "title": "Idempotency mode per face", "opts": self.model._meta, "form": form,
            "modes": [(face, tenant.idempotency_mode_for(face)) for face in FACES],
        }
        return TemplateResponse(request, "admin/tally/idempotency_modes.html", context)
