from typing import Any

from django.apps import AppConfig


class IdempotencyConfig(AppConfig):
    name = "idempotency"
    label = "idempotency"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from idempotency.sealing import idempotency_records_reseal
        from wallets.sealing import sealed_store_register

        # Stored answers that show a secret once, for `manage.py secrets_reseal`.
        sealed_store_register(name="idempotency_records", reseal_batch=idempotency_records_reseal)
        from tenants.signals import tenant_restored

        tenant_restored.connect(_tenant_restored, dispatch_uid="idempotency-tenant-restored")


def _tenant_restored(*, schema_name: str, **_: Any) -> None:
    # Replay-cache entries recorded after the restore point answer for records the restored
    # schema does not hold (a 201 for a payment that no longer exists): dropped at once.
    from django_tenants.utils import schema_context

    from idempotency.hotpath import replay_cache_clear

    with schema_context(schema_name):
        replay_cache_clear()
