"""Mutual TLS for every cluster, one identity per person, and who may do what.

- :mod:`.identity` (pure): an :class:`Identity` from a TLS peer's certificate.
- :mod:`.pki`: a cluster's own certificate authority (``cryptography``): the
  scheduler's, the workers' and each person's certificate, revocation lists.
- :mod:`.tls`: ``distributed.Security`` objects made from them, revocation lists
  loaded into running listeners.

The rules of who may do what are the control plane's (:mod:`clustersdk.control.access`).
"""
