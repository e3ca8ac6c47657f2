"""The merchant face's webhook endpoints (`merchant/webhook_endpoints`), registered on the
merchant router by config/api_urls.py."""
