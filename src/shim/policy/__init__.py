"""The grant policy: what a resource's device source may grant a container (docs/configuration.md,
"Grant policy"). Deny by default: the operator declares what each driver may grant
(``settings``), over a floor of rules no declaration lifts without ``unsafe`` (``floor``);
``check`` judges every grant, ``suggest`` derives the declaration grants need."""

from .check import GrantPolicy
from .floor import RULES, Floor, FloorRule
from .settings import CDI_ANNOTATION_PREFIX, GrantPolicySettings
from .suggest import Suggestion

__all__ = [
    "CDI_ANNOTATION_PREFIX",
    "RULES",
    "Floor",
    "FloorRule",
    "GrantPolicy",
    "GrantPolicySettings",
    "Suggestion",
]
