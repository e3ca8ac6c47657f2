"""The base of every request and response shape of the faces: DRF's Serializer, its declared
fields copied per instance the fast way (fastpath.shapes)."""

from __future__ import annotations

from fastpath.shapes import Serializer as FieldCopyingSerializer

Serializer = FieldCopyingSerializer
