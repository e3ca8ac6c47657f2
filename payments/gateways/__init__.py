"""Card gateways (PSPs): one interface (`base.Gateway`), two adapters (the simulator for
development and tests, Stripe for production), webhook signature checks and the sealing of
each tenant's credentials. Nothing here touches the ledger: payments.services does."""
