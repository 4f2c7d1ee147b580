"""Helpers the test layers share: tokens and tenants, pools, sealed values, Kafka messages and their headers,
hot-window members, OpenMetrics scrapes, an OTLP receiver, real processes and their ports, the HA cluster.
Importable from any layer; no fixtures live here (fakes of Sundial's own interfaces are in
:mod:`sundial_common.testing`)."""
