from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Register the relay tasks in every process (web included), so the after-commit
        # kick can run "webhooks.outbox_relay" in eager mode (tests) by name.
        from webhooks import tasks  # noqa: F401
