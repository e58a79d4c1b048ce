"""Hosting runs: many runs in one process (``RunRegistry``) and the versioned
JSON forms (``serialization``) that carry runs, events and statuses across
processes. Built on the driver; the driver never imports it.
"""

from __future__ import annotations
