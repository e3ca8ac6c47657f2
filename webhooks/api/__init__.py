"""The merchant face's webhook endpoints (`merchant/webhook_endpoints`): viewsets and
shapes, registered on the merchant router by the composition root (config/api_urls.py).

webhooks sits above payments: it builds on the faces' base viewset and fields
(payments.api); payments never imports webhooks."""
