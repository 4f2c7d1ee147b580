"""Security: bearer tokens and their keys, and envelope encryption of tenants' data at rest."""
