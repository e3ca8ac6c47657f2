from django.apps import AppConfig


class PaymentsConfig(AppConfig):
    name = "payments"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from payments.services.secrets_reseal import customer_contacts_reseal, gateway_accounts_reseal
        from wallets.sealing import sealed_store_register

        # Every place a sealed (or encrypted) secret is stored, for `manage.py secrets_reseal`.
        sealed_store_register(name="gateway_accounts", reseal_batch=gateway_accounts_reseal)
        sealed_store_register(name="customer_contacts", reseal_batch=customer_contacts_reseal)
