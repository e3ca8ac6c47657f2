from typing import Any

from django.apps import AppConfig


class WalletsConfig(AppConfig):
    name = "wallets"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from tenants.signals import tenant_created, tenant_restored
        from wallets import checks  # noqa: F401  - registers the sealing ring check

        tenant_created.connect(_tenant_ledger_bootstrap, dispatch_uid="wallets-ledger-bootstrap")
        tenant_created.connect(_tenant_roles_ensure, dispatch_uid="wallets-roles-ensure")
        tenant_restored.connect(_tenant_restored, dispatch_uid="wallets-tenant-restored")

        from django.conf import settings
        from django.db.models.signals import pre_save

        pre_save.connect(_staff_login_saving, sender=settings.AUTH_USER_MODEL, dispatch_uid="wallets-staff-login-deactivation")

        from wallets.contacts import CustomerContactsMigration, customer_contacts_new_tenant
        from wallets.daily_totals import AccountDailyTotalsMigration, MerchantDailyTotalsMigration, daily_totals_new_tenant
        from wallets.staged.spec import staged_migration_register

        staged_migration_register(CustomerContactsMigration())
        # A new tenant has no plaintext contacts: it starts encrypted, as webhook secrets start sealed.
        tenant_created.connect(customer_contacts_new_tenant, dispatch_uid="wallets-contacts-new-tenant")
        staged_migration_register(MerchantDailyTotalsMigration())
        staged_migration_register(AccountDailyTotalsMigration())
        tenant_created.connect(daily_totals_new_tenant, dispatch_uid="wallets-daily-totals-new-tenant")
        import wallets.staged.admin  # noqa: F401


def _tenant_ledger_bootstrap(*, tenant: Any, **_: Any) -> None:
    from wallets.services.ledger import tenant_ledger_bootstrap

    tenant_ledger_bootstrap(main_currency=tenant.main_currency, exponent=tenant.currency_exponent)


def _tenant_roles_ensure(**_: Any) -> None:
    from wallets.services.roles import staff_roles_ensure

    staff_roles_ensure()


def _tenant_restored(*, schema_name: str, **_: Any) -> None:
    # API keys made or revoked after the restore point: every process's cached keys of the
    # tenant are distrusted at once instead of at their TTL.
    from wallets.keycache import api_key_epoch_bump

    api_key_epoch_bump(schema=schema_name)


def _staff_login_saving(*, instance: Any, update_fields: Any = None, raw: bool = False, **_: Any) -> None:
    from wallets.services.roles import staff_login_deactivation_apply

    staff_login_deactivation_apply(user=instance, update_fields=update_fields, raw=raw)
