"""Helpers the test layers share: tokens and tenants, pools, sealed values, broker messages, an OTLP receiver,
real processes and their ports, the HA cluster. Importable from any layer; no fixtures live here."""
