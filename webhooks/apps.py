from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from tenants.signals import tenant_created
        from wallets.staged.spec import staged_migration_register

        # Register the relay tasks in every process (web included), so the after-commit
        # kick can run "webhooks.outbox_relay" in eager mode (tests) by name.
        from webhooks import tasks  # noqa: F401
        from webhooks.secrets import WebhookSecretsMigration, webhook_secrets_new_tenant

        # The re-seal of signing secrets is a staged migration like wallets' own; a new
        # tenant has nothing to re-seal and starts sealed.
        staged_migration_register(WebhookSecretsMigration())
        tenant_created.connect(webhook_secrets_new_tenant, dispatch_uid="webhooks-secrets-new-tenant")
