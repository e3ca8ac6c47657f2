"""Webhook endpoints and deliveries."""
