"""The HTTP API's shared kit: what every face's viewsets stand on.

The base viewset and its faces, API-key authentication and staff roles, the SPEC's
error envelope, throttling, cursor pagination, the strict JSON parser, shared serializer
fields, the face router and the OpenAPI schema hooks. Each app's `api/` package builds its
viewsets on this kit; the kit knows no app's viewsets.
"""
