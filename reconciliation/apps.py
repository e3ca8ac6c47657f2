from django.apps import AppConfig


class ReconciliationConfig(AppConfig):
    name = "reconciliation"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from reconciliation import tasks  # noqa: F401 - registered in every process (eager mode in tests)
        from reconciliation.services import reconciliation_restored_schema_check, reconciliation_schedule_ensure_after_migrate
        from tenants.signals import tenant_restore_staged

        post_migrate.connect(reconciliation_schedule_ensure_after_migrate, sender=self, dispatch_uid="reconciliation_schedule")
        tenant_restore_staged.connect(reconciliation_restored_schema_check, dispatch_uid="reconciliation-restored-schema")
