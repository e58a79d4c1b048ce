"""Approving a run's waiting tool calls by run id, for ``RunRegistry``.

The registry finds the run (owner rules included); the run's own handle
decides each answer, so an answer here means exactly what it means on the
handle: taken once, validated, refused after the run ended.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Dict, List, Optional

from loopctl.approvals import PendingApproval
from loopctl.hosting.entry import _Entry


class RegistryApprovals:
    """The approval methods of ``RunRegistry`` (lookups by id and owner)."""

    def _get(self, run_id: str, owner: Optional[Hashable] = None) -> _Entry:
        raise NotImplementedError

    def pending_approvals(self, run_id: str, *, owner: Optional[Hashable] = None) -> List[PendingApproval]:
        """The run's tool calls waiting for a person's answer (empty once it ended).

        Raises:
            KeyError: unknown ``run_id``, or another ``owner``'s run.
        """
        handle = self._get(run_id, owner).handle
        return [] if handle is None else handle.pending_approvals()  # None: finished and compacted

    def approve(
        self,
        run_id: str,
        call_id: str,
        *,
        by: Optional[str] = None,
        arguments: Optional[Dict[str, Any]] = None,
        owner: Optional[Hashable] = None,
        subagent: Optional[str] = None,
    ) -> bool:
        """Let the run's waiting call run, optionally with edited ``arguments``.

        ``subagent`` says which run of the tree the call waits in (``""``
        the run itself, a sub-agent's path); None: wherever it waits, if
        that is one place only (else ``ValueError``).

        Returns:
            True when this answer was taken; False when the call is not
            waiting (unknown id, answered already, or the run ended).

        Raises:
            KeyError: unknown ``run_id``, or another ``owner``'s run.
            ValueError: ``arguments`` do not fit the tool's schema (the
                message names the field); the call stays pending.
        """
        handle = self._get(run_id, owner).handle
        return False if handle is None else handle.approve(call_id, by=by, arguments=arguments, subagent=subagent)

    def deny(
        self,
        run_id: str,
        call_id: str,
        reason: str,
        *,
        by: Optional[str] = None,
        owner: Optional[Hashable] = None,
        subagent: Optional[str] = None,
    ) -> bool:
        """Refuse the run's waiting call; the model reads "the user denied this call: <reason>".

        ``subagent`` says where the call waits, as for ``approve``.

        Returns:
            True when this answer was taken; False when the call is not waiting.

        Raises:
            KeyError: unknown ``run_id``, or another ``owner``'s run.
        """
        handle = self._get(run_id, owner).handle
        return False if handle is None else handle.deny(call_id, reason, by=by, subagent=subagent)


__all__ = ["RegistryApprovals"]
