from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from tenants.signals import tenant_created
        from wallets.sealing import sealed_store_register
        from wallets.staged.spec import staged_migration_register

        # Registered in every process, so an eager after-commit kick finds the task by name.
        from webhooks import tasks  # noqa: F401
        from webhooks.secrets import WebhookSecretsMigration, webhook_secrets_new_tenant, webhook_secrets_reseal

        # A new tenant has no plaintext secrets to re-seal: it starts sealed.
        staged_migration_register(WebhookSecretsMigration())
        tenant_created.connect(webhook_secrets_new_tenant, dispatch_uid="webhooks-secrets-new-tenant")
        sealed_store_register(name="webhook_endpoints", reseal_batch=webhook_secrets_reseal)
