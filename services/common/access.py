"""Who may touch which run: the access policy of every service.

Policy (documented in the README): a caller with no role at all in a run's project is told
NOT_FOUND, so run ids of other tenants cannot be probed (exactly as for a run that does not
exist); a member of the project without the role the call needs gets PERMISSION_DENIED
(FORBIDDEN). Calls that name a project themselves (ClaimRuns, ListRuns, IngestEvent,
CreateRun) answer PERMISSION_DENIED naming it.

Writes filter on the projects where the caller holds the role inside the SQL statement
itself (`projects_with`), so the role check costs no extra round trip and can never be
separated from the change it guards; when such a write changed nothing, `check_run_access`
decides what the caller may learn.
"""

from __future__ import annotations

from collections.abc import Iterable

from services.common import errors
from services.common.auth import Principal
from services.common.principals import ALL_PROJECTS


def projects_with(principal: Principal, roles: str | Iterable[str]) -> list[str] | None:
    """Projects where the principal holds one of roles (directly or through admin);
    None means every project (a '*' grant). Passed to SQL as `$n::text[] IS NULL OR
    project_id = ANY($n)`."""
    wanted = {roles} if isinstance(roles, str) else set(roles)
    if principal.roles_in(ALL_PROJECTS) & wanted:
        return None
    return sorted(p for p in principal.roles if p != ALL_PROJECTS and principal.roles_in(p) & wanted)


def check_run_access(principal: Principal, project_id: str | None, roles: str | Iterable[str], run_id: str) -> None:
    """Raises NOT_FOUND (no such run: project_id None, or no role in its project) or
    PERMISSION_DENIED (a role there, not one of roles)."""
    wanted = [roles] if isinstance(roles, str) else list(roles)
    if project_id is None:
        raise errors.not_found("run", run_id)
    held = principal.roles_in(project_id)
    if not held:
        raise errors.not_found("run", run_id)
    if not held & set(wanted):
        names = " or ".join(wanted)
        raise errors.forbidden(
            f"principal {principal.principal_id} has no {names} role in project {project_id}",
            project_id=project_id,
            role=names,
        )


def require_role(principal: Principal, project_id: str, role: str) -> None:
    """A call that names its project: PERMISSION_DENIED naming it unless the caller holds role there."""
    if not principal.has(project_id, role):
        raise errors.forbidden(
            f"principal {principal.principal_id} has no {role} role in project {project_id}",
            project_id=project_id,
            role=role,
        )


def require_member(principal: Principal, project_id: str) -> None:
    """A read that names its project: PERMISSION_DENIED naming it unless the caller holds a
    member's role there (any role but tool)."""
    if not principal.member_of(project_id):
        raise errors.forbidden(
            f"principal {principal.principal_id} has no role in project {project_id}", project_id=project_id
        )
