"""Staff actions in the back office: a button opens a confirmation page whose form carries
an idempotency key of its own; confirming runs the action's one service call through
idempotency.admin.staff_form_submit (at most once per key, audited)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from idempotency.admin import StaffActionForm, staff_form_submit
from wallets.models import StaffMember
from wallets.services.principals import staff_member_get_or_create


class ReasonForm(StaffActionForm):
    reason = forms.CharField(max_length=500, widget=forms.Textarea(attrs={"rows": 2, "cols": 60}))


class OptionalReasonForm(StaffActionForm):
    reason = forms.CharField(max_length=500, required=False, widget=forms.Textarea(attrs={"rows": 2, "cols": 60}))


@dataclass(frozen=True)
class StaffAction:
    name: str  # URL segment and audit action (admin.<name>)
    label: str  # button text
    permission: str  # "app_label.codename"
    form: type[StaffActionForm]
    # (request, object, cleaned data) -> message, or (message, secret shown once); one service call.
    run: Callable[[HttpRequest, Any, dict[str, Any]], str | tuple[str, str]]
    description: str = ""
    audit: bool = True  # False when the service writes its own audit entry
    show: Callable[[Any], bool] = lambda obj: True
    # (request, object, cleaned data) -> more data for `run`, got before the confirmation's
    # transaction opens: a PSP read, never made inside one.
    prepare: Callable[[HttpRequest, Any, dict[str, Any]], dict[str, Any]] | None = None


def staff_of(request: HttpRequest) -> StaffMember:
    """The StaffMember (API principal, adjustment maker) of the admin login."""
    return staff_member_get_or_create(username=request.user.get_username())


class StaffActionsMixin(admin.ModelAdmin):  # type: ignore[type-arg]
    staff_actions: tuple[StaffAction, ...] = ()
    change_form_template = "admin/tally/change_form.html"

    def get_urls(self) -> list[URLPattern]:
        name = f"{self.model._meta.app_label}_{self.model._meta.model_name}_act"
        return [path("<path:object_id>/act/<str:action>/", self.admin_site.admin_view(self.staff_action_view), name=name), *super().get_urls()]

    def _staff_actions_for(self, request: HttpRequest, obj: Any) -> list[dict[str, str]]:
        name = f"admin:{self.model._meta.app_label}_{self.model._meta.model_name}_act"
        return [
            {"label": a.label, "url": reverse(name, args=[quote(obj.pk), a.name], current_app=self.admin_site.name)}
            for a in self.staff_actions
            if request.user.has_perm(a.permission) and a.show(obj)
        ]

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None) -> HttpResponse:
        obj = self.get_object(request, unquote(object_id))
        context = {**(extra_context or {}), "staff_actions": self._staff_actions_for(request, obj) if obj is not None else []}
        return super().change_view(request, object_id, form_url, extra_context=context)

    def staff_action_view(self, request: HttpRequest, object_id: str, action: str) -> HttpResponse:
        spec = next((a for a in self.staff_actions if a.name == action), None)
        if spec is None:
            raise Http404("no such action")
        if not request.user.has_perm(spec.permission):
            raise PermissionDenied
        obj = self.get_object(request, unquote(object_id))  # admin URLs quote ids (as change_view unquotes)
        if obj is None or not self.has_view_or_change_permission(request, obj):
            raise Http404("no such object")
        back = reverse(
            f"admin:{self.model._meta.app_label}_{self.model._meta.model_name}_change", args=[quote(obj.pk)], current_app=self.admin_site.name
        )
        prepare = spec.prepare
        form, result = staff_form_submit(
            request, spec.form, action=spec.name, target=obj, run=lambda data: spec.run(request, obj, data), audit=spec.audit,
            prepare=None if prepare is None else (lambda data: prepare(request, obj, data)),
        )
        if result is not None:
            if result.secret is not None:  # shown on this page only: never in a message cookie
                return TemplateResponse(request, "admin/tally/secret_shown.html", {
                    **self.admin_site.each_context(request), "title": spec.label, "object": obj, "opts": self.model._meta,
                    "message": result.message, "secret": result.secret, "replayed": result.replayed, "back_url": back,
                })
            prefix = "Already done (this confirmation was submitted before): " if result.replayed else ""
            self.message_user(request, prefix + result.message, level=messages.SUCCESS)
            return HttpResponseRedirect(back)
        context = {
            **self.admin_site.each_context(request),
            "title": f"{spec.label}: {obj}",
            "object": obj,
            "opts": self.model._meta,
            "action": spec,
            "form": form,
            "back_url": back,
        }
        return TemplateResponse(request, "admin/tally/confirm_action.html", context)
