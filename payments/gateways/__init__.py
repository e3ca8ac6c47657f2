"""Card gateways (PSPs): one interface (`base.Gateway`), two adapters; no ledger here."""
