"""The payments service: one module per movement (docs/ARCHITECTURE.md, "Layers")."""
