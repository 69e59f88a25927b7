"""The one place checks are registered: `@check(name, description, needs=..., uses=...)`.

A check is a pure function of parsed inputs and the site's expectations,
`func(*inputs, expectations) -> Finding`, inputs in the order `needs` then `uses`, named
as in `snapshot.INPUTS`. `needs` inputs are required (the check is UNKNOWN without them);
`uses` inputs are optional (None when not collected). The decorator returns the function
wrapped to give a `CheckResult` carrying the check's name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from trainctl.errors import UsageError
# check_site_check_names: job/agent.py imports it from here
from trainctl.health.check_names import CHECK_NAMES, check_site_check_names  # noqa: F401
from trainctl.health.snapshot import INPUTS
from trainctl.health.status import CheckResult, Finding


@dataclass(frozen=True)
class CheckSpec:
    name: str
    description: str
    needs: tuple[str, ...]
    uses: tuple[str, ...]
    hardware: str | None        # "gpu", "nvlink", "ib": skipped where the site has none
    func: Callable[..., CheckResult]

    @property
    def files(self) -> tuple[str, ...]:
        """The snapshot files this check reads, for `trainctl health list`."""
        return tuple(source.name for name in self.needs + self.uses for source in INPUTS[name])


_REGISTRY: dict[str, CheckSpec] = {}


def check(name: str, description: str, *, needs: Iterable[str] = (), uses: Iterable[str] = (),
          hardware: str | None = None) -> Callable[[Callable], Callable]:
    def register(func: Callable[..., Finding]) -> Callable[..., CheckResult]:
        @functools.wraps(func)
        def run(*args: object) -> CheckResult:
            return CheckResult(name, *func(*args))

        spec = CheckSpec(name, description, tuple(needs), tuple(uses), hardware, run)
        unknown = [i for i in spec.needs + spec.uses if i not in INPUTS]
        if name in _REGISTRY or name not in CHECK_NAMES or unknown:
            raise ValueError(f"check {name!r}: registered twice, not listed in check_names.CHECK_NAMES, "
                             f"or unknown inputs {unknown}")
        _REGISTRY[name] = spec
        return run
    return register


def all_checks() -> list[CheckSpec]:
    import trainctl.health.checks  # noqa: F401  (importing the check modules registers them)
    return sorted(_REGISTRY.values(), key=lambda spec: spec.name)


def parse_check_list(text: str, option: str = "--only") -> tuple[str, ...]:
    """`gpu,ib.ports` -> ("gpu", "ib.ports"); an empty entry (`,`, `gpu,,ib`) is named as one."""
    names = tuple(name.strip() for name in text.split(","))
    if not all(names):
        raise UsageError(f"{option} {text!r}: an empty check name (nothing between two commas, or at an end)",
                         hint="trainctl health list shows the checks and families")
    return names


def select_checks(only: Iterable[str] | None = None) -> list[CheckSpec]:
    """Checks named in `only` (full names, or families such as "gpu"); all when None."""
    specs = all_checks()
    if only is None:
        return specs
    wanted = set(only)
    families = {spec.name.split(".")[0] for spec in specs}
    unknown = wanted - {spec.name for spec in specs} - families
    if unknown:
        raise UsageError(f"unknown check(s): {', '.join(sorted(unknown))}",
                         hint="trainctl health list shows them")
    return [s for s in specs if s.name in wanted or s.name.split(".")[0] in wanted]
