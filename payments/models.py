"""Payment objects (payments, refunds, transfers, top-ups, adjustments, intents) and the outbox."""
