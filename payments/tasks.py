"""Recovery of card top-ups and payouts (payments/services/topup_saga.py, payout_saga.py),
fanned out per tenant by beat (docs/ARCHITECTURE.md, "Beat, due work"). Switched-off tenants
included: their PSP webhooks still land, and a charge taken for one of their top-ups is
settled or given back, a payout sent is followed to its end. Scheduled payouts, per active
tenant; a payout's send to the PSP after the commit that made it, and the return of a failed
payout's money after the webhook that failed it."""

from __future__ import annotations

from celery import shared_task
from tenant_schemas_celery.task import TenantTask

from payments.services.payout_saga import payout_recovery_run, payout_return, payout_submit
from payments.services.payouts import payouts_scheduled_run
from payments.services.topup_budget import LoopBudget, recovery_pass_deadline
from payments.services.topup_saga import topup_recovery_run
from tenants.duework import due_work_schemas
from tenants.models import DueWorkKind
from tenants.selectors import tenant_schemas_active, tenant_schemas_all
from tenants.services import task_send_in_each


@shared_task(base=TenantTask, name="payments.topups_recover_due_tenants", ignore_result=True)  # type: ignore[untyped-decorator]  # celery is untyped
def topups_recover_due_tenants() -> int:
    """Beat, every 10 s: `topups_recover_tenant` in each tenant whose recovery work is due."""
    return task_send_in_each(topups_recover_tenant, schemas=due_work_schemas(kinds=[DueWorkKind.TOPUPS], switched_off_too=True))


@shared_task(base=TenantTask, name="payments.topups_recover_all_tenants", ignore_result=True)  # type: ignore[untyped-decorator]  # celery is untyped
def topups_recover_all_tenants() -> int:
    """Beat's safety sweep, every TALLY_SAFETY_SWEEP_SECONDS: `topups_recover_tenant` in every tenant."""
    return task_send_in_each(topups_recover_tenant, schemas=tenant_schemas_all())


@shared_task(base=TenantTask, name="payments.topups_recover_tenant", ignore_result=True)  # type: ignore[untyped-decorator]  # celery is untyped
def topups_recover_tenant() -> dict[str, int]:
    """Runs in one tenant's schema: payouts to send or ask about, then orphaned top-ups (whose
    pass settles the due-work row both share). One time budget for both, inside the task's
    soft limit: the payout pass is one of the pass's loops (its share,
    TALLY_TOPUP_RECOVERY_LOOP_SECONDS, cut to the pass's deadline), and the top-up pass's
    loops get what is left before the same deadline; a payout backlog is left due."""
    pass_deadline = recovery_pass_deadline()
    payouts = payout_recovery_run(budget=LoopBudget.from_settings(pass_deadline=pass_deadline))
    return {**{f"payouts_{outcome}": n for outcome, n in payouts.items()}, **topup_recovery_run(pass_deadline=pass_deadline)}


@shared_task(base=TenantTask, name="payments.payout_submit", ignore_result=True)  # type: ignore[untyped-decorator]  # celery is untyped
def payout_submit_task(payout_id: str) -> str:
    """Send one payout to the PSP (queued on the commit that made or approved it)."""
    return payout_submit(payout_id=payout_id)


@shared_task(base=TenantTask, name="payments.payout_return", ignore_result=True)  # type: ignore[untyped-decorator]  # celery is untyped
def payout_return_task(payout_id: str) -> str:
    """Take back at the PSP a payout's money it failed after it had it, then give it to the
    merchant (queued on the commit of the webhook that failed it)."""
    return payout_return(payout_id=payout_id)


@shared_task(base=TenantTask, name="payments.payouts_scheduled_all_tenants", ignore_result=True)  # type: ignore[untyped-decorator]  # celery is untyped
def payouts_scheduled_all_tenants() -> int:
    """Beat, every TALLY_PAYOUT_SCHEDULE_SECONDS: `payouts_scheduled_tenant` in each active tenant."""
    return task_send_in_each(payouts_scheduled_tenant, schemas=tenant_schemas_active())


@shared_task(base=TenantTask, name="payments.payouts_scheduled_tenant", ignore_result=True)  # type: ignore[untyped-decorator]  # celery is untyped
def payouts_scheduled_tenant() -> dict[str, int]:
    """Runs in one tenant's schema: today's scheduled payouts (once per merchant, asset and day)."""
    return payouts_scheduled_run()
