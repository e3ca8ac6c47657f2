"""The merchant face's webhook endpoints (`merchant/webhook_endpoints`): viewsets and
shapes, registered on the merchant router by the composition root (config/api_urls.py).

webhooks sits above payments: it builds on the API kit's base viewset and fields
(apikit); payments never imports webhooks."""
