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
