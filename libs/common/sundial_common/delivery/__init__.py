"""Every request Sundial sends out: one path for notifications and HTTP targets alike.

- :mod:`.signing`: Standard Webhooks signatures (``webhook-id``, ``webhook-timestamp``, ``webhook-signature``),
  destination secrets, and verification for receivers and tests;
- :mod:`.address_policy`: which resolved addresses a request may go to (a pure function: SSRF protection);
- :mod:`.sender`: the HTTP client around both — resolve once, check, connect to the very address checked,
  timeouts, retries honouring ``Retry-After``, a response size cap, no redirects, no proxy variables.
"""
