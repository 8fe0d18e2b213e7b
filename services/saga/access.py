"""Who may touch a run's journal.

Journal writes pass the caller's projects into the statement itself (one round trip on the
happy path); when nothing was written, `check` decides what the caller may learn.

Tenant isolation rule of the saga service: a caller with no role at all in the run's project
gets NOT_FOUND, exactly as for a run that does not exist; a caller with some role there but not
the one needed gets PERMISSION_DENIED (FORBIDDEN).
"""

from __future__ import annotations

from services.common import errors
from services.common.auth import Principal
from services.common.principals import ALL_PROJECTS


def project_scope(principal: Principal, role: str) -> list[str] | None:
    """Projects where the principal holds role; None means every project (a '*' grant)."""
    if principal.has(ALL_PROJECTS, role):
        return None
    return [p for p in principal.roles if p != ALL_PROJECTS and principal.has(p, role)]


def check(principal: Principal, project_id: str | None, run_id: str, *roles: str) -> None:
    """Raises NOT_FOUND or FORBIDDEN unless the principal holds one of roles in project_id
    (None: the run does not exist)."""
    if project_id is None or not principal.roles_in(project_id):
        raise errors.not_found("run", run_id)
    if not any(principal.has(project_id, r) for r in roles):
        raise errors.forbidden(
            f"principal {principal.principal_id} has no {' or '.join(roles)} role in project {project_id}",
            project_id=project_id,
            role=roles[0],
        )
