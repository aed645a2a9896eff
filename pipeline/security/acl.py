"""Kafka's ACL model and its evaluation (sans-I/O).

An ACL binding says that a principal from a host may (ALLOW) or may not
(DENY) perform an operation on the resources a pattern names. The rules are
Kafka's ``kafka.security.authorizer.AclAuthorizer.authorizeAction`` (and the
same in KRaft's ``StandardAuthorizerData.authorize``):

* a ``super.users`` principal may do anything;
* the ACLs that *match the resource* are the LITERAL ones with its exact name,
  the LITERAL ``*`` (wildcard) ones, and the PREFIXED ones whose name is a
  prefix of it (KIP-290), all of the resource's type;
* if none match, the answer is ``allow.everyone.if.no.acl.found`` (false by
  default);
* otherwise a DENY that matches principal (or ``User:*``), host (or ``*``) and
  operation (or ALL) refuses, whatever the ALLOWs say (DENY wins);
* else an ALLOW that matches principal, host and the operation, ALL, or an
  operation that implies it, permits: DESCRIBE is implied by READ, WRITE,
  DELETE and ALTER; DESCRIBE_CONFIGS by ALTER_CONFIGS
  (``AclAuthorizer.aclsAllowAccess``); anything else is refused.

Implication only widens ALLOWs: a DENY of READ does not deny DESCRIBE, as in
Kafka. Filters (``AclBindingFilter``) are Kafka's ``AclBindingFilter.matches``
(``ResourcePatternFilter`` with ANY and MATCH pattern types), used by
DescribeAcls and DeleteAcls.

The enum values are the wire values of Kafka's ``ResourceType``,
``PatternType``, ``AclOperation`` and ``AclPermissionType``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

__all__ = (
    "CLUSTER_NAME",
    "WILDCARD",
    "WILDCARD_PRINCIPAL",
    "AclBinding",
    "AclBindingFilter",
    "AclOperation",
    "AclPermissionType",
    "Authorizer",
    "InvalidAclError",
    "PatternType",
    "ResourceType",
    "parse_super_users",
)

WILDCARD = "*"
"""Kafka ``ResourcePattern.WILDCARD_RESOURCE``; also the any-host ACL host."""
WILDCARD_PRINCIPAL = "User:*"
"""Kafka ``AclEntry.WildcardPrincipal``: an ACL for every principal."""
CLUSTER_NAME = "kafka-cluster"
"""Kafka ``CLUSTER_NAME``: the one CLUSTER resource's name."""


class ResourceType(enum.IntEnum):
    """Kafka ``org.apache.kafka.common.resource.ResourceType`` (wire codes)."""

    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    """Kafka ``PatternType`` (KIP-290). ANY and MATCH exist in filters only."""

    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(enum.IntEnum):
    """Kafka ``AclOperation`` (wire codes). ANY exists in filters only."""

    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class AclPermissionType(enum.IntEnum):
    """Kafka ``AclPermissionType``. ANY exists in filters only."""

    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


# AclAuthorizer.aclsAllowAccess: an ALLOW of any of these operations also
# allows the key (DESCRIBE is implied by READ/WRITE/DELETE/ALTER,
# DESCRIBE_CONFIGS by ALTER_CONFIGS).
_IMPLIED_BY: dict[AclOperation, frozenset[AclOperation]] = {
    AclOperation.DESCRIBE: frozenset({AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE,
                                      AclOperation.DELETE, AclOperation.ALTER}),
    AclOperation.DESCRIBE_CONFIGS: frozenset({AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS}),
}


class InvalidAclError(ValueError):
    """An ACL binding or filter Kafka would refuse (``InvalidRequestException``): the message says why."""


def _check_principal(principal: str) -> None:
    # KafkaPrincipal.fromString: "type:name", both parts non-empty.
    kind, sep, name = principal.partition(":")
    if not sep or not kind or not name:
        raise InvalidAclError(f"principal {principal!r} is not of the form type:name (e.g. User:alice)")


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL: Kafka ``AclBinding`` = ``ResourcePattern`` + ``AccessControlEntry``.

    ``principal`` is ``type:name`` (``User:alice``, ``User:*`` for everyone),
    ``host`` an IP address or ``*``.
    """

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission: AclPermissionType

    def validate(self) -> None:
        """Kafka's checks on a new ACL (``AclControlManager.validateNewAcl``, ``AclAuthorizer.createAcls``).

        :raises InvalidAclError: an UNKNOWN/ANY field, a MATCH/ANY pattern, an empty
            resource name, a malformed principal, or an empty host.
        """
        if self.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
            raise InvalidAclError(f"invalid resource type {self.resource_type.name}")
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise InvalidAclError(f"invalid pattern type {self.pattern_type.name}: only LITERAL or PREFIXED")
        if self.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
            raise InvalidAclError(f"invalid operation {self.operation.name}")
        if self.permission not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
            raise InvalidAclError(f"invalid permission type {self.permission.name}")
        if not self.resource_name:
            raise InvalidAclError("resource name must not be empty")
        _check_principal(self.principal)
        if not self.host:
            raise InvalidAclError("host must not be empty (use * for any host)")

    def matches_resource(self, resource_type: ResourceType, name: str) -> bool:
        """Whether this ACL applies to resource ``name`` of ``resource_type`` (AclAuthorizer.matchingAcls)."""
        if self.resource_type != resource_type:
            return False
        if self.pattern_type == PatternType.LITERAL:
            return self.resource_name == name or self.resource_name == WILDCARD
        if self.pattern_type == PatternType.PREFIXED:
            return name.startswith(self.resource_name)
        return False

    def _applies_to(self, principal: str, host: str) -> bool:
        return (self.principal == principal or self.principal == WILDCARD_PRINCIPAL) and (
            self.host == host or self.host == WILDCARD)

    def __str__(self) -> str:
        return (f"(principal={self.principal}, host={self.host}, operation={self.operation.name}, "
                f"permissionType={self.permission.name}) on {self.resource_type.name}:"
                f"{self.pattern_type.name}:{self.resource_name}")


_E = TypeVar("_E", bound=enum.IntEnum)


def _enum(cls: type[_E], value: int) -> _E:
    try:
        return cls(value)
    except ValueError:
        return cls(0)  # UNKNOWN, as Kafka's fromCode maps unknown codes


def binding(resource_type: int, resource_name: str, pattern_type: int, principal: str, host: str,
            operation: int, permission: int) -> AclBinding:
    """An ``AclBinding`` from wire codes; unknown codes become UNKNOWN (then refused by ``validate``)."""
    return AclBinding(_enum(ResourceType, resource_type), resource_name,
                      _enum(PatternType, pattern_type), principal, host,
                      _enum(AclOperation, operation), _enum(AclPermissionType, permission))


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """Kafka ``AclBindingFilter``: which ACLs DescribeAcls lists and DeleteAcls removes.

    ``None`` for a name, principal or host matches any; ANY for an enum matches
    any; pattern type MATCH selects the ACLs that would apply to resource
    ``resource_name`` (LITERAL equal or ``*``, PREFIXED a prefix of it).
    """

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission: AclPermissionType = AclPermissionType.ANY

    @classmethod
    def from_wire(cls, resource_type: int, resource_name: str | None, pattern_type: int,
                  principal: str | None, host: str | None, operation: int, permission: int) -> "AclBindingFilter":
        return cls(_enum(ResourceType, resource_type), resource_name,
                   _enum(PatternType, pattern_type), principal, host,
                   _enum(AclOperation, operation), _enum(AclPermissionType, permission))

    def validate(self) -> None:
        """Kafka ``AclBindingFilter.findIndefiniteField``: no UNKNOWN anywhere.

        :raises InvalidAclError: naming the UNKNOWN field.
        """
        for name, value in (("resource type", self.resource_type), ("pattern type", self.pattern_type),
                            ("operation", self.operation), ("permission type", self.permission)):
            if value == 0:
                raise InvalidAclError(f"filter has an unknown {name}")

    def matches(self, acl: AclBinding) -> bool:
        """Kafka ``AclBindingFilter.matches`` (ResourcePatternFilter + AccessControlEntryFilter)."""
        if self.resource_type != ResourceType.ANY and self.resource_type != acl.resource_type:
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH) and self.pattern_type != acl.pattern_type:
            return False
        if self.resource_name is not None:
            if self.pattern_type in (PatternType.ANY, acl.pattern_type):
                if self.resource_name != acl.resource_name:
                    return False
            elif acl.pattern_type == PatternType.LITERAL:  # MATCH
                if acl.resource_name not in (self.resource_name, WILDCARD):
                    return False
            elif not self.resource_name.startswith(acl.resource_name):  # MATCH against PREFIXED
                return False
        if self.principal is not None and self.principal != acl.principal:
            return False
        if self.host is not None and self.host != acl.host:
            return False
        if self.operation != AclOperation.ANY and self.operation != acl.operation:
            return False
        return self.permission == AclPermissionType.ANY or self.permission == acl.permission


def parse_super_users(value: str) -> frozenset[str]:
    """Kafka ``super.users``: principals separated by semicolons (``User:admin;User:ops``), blanks ignored.

    :raises InvalidAclError: an entry that is not ``type:name``.
    """
    users = frozenset(part.strip() for part in value.split(";") if part.strip())
    for user in users:
        _check_principal(user)
    return users


class Authorizer:
    """The ACLs in memory and Kafka's decision over them (sans-I/O: persisting is the caller's).

    Args:
        acls: the initial bindings (e.g. loaded from ``pipeline.security.acl_store``).
        super_users: principals allowed everything (Kafka ``super.users``).
        allow_everyone_if_no_acl_found: the answer for a resource no ACL matches
            (Kafka ``allow.everyone.if.no.acl.found``, default false).
    """

    def __init__(self, acls: Iterable[AclBinding] = (), super_users: Iterable[str] = (),
                 allow_everyone_if_no_acl_found: bool = False) -> None:
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        # Bindings by resource type, in insertion order (a dict as an ordered set).
        self._acls: dict[ResourceType, dict[AclBinding, None]] = {}
        for acl in acls:
            self._acls.setdefault(acl.resource_type, {})[acl] = None

    @property
    def acls(self) -> list[AclBinding]:
        """Every binding."""
        return [acl for by_type in self._acls.values() for acl in by_type]

    def replace(self, acls: Iterable[AclBinding]) -> None:
        """Make ``acls`` the bindings, in their order (a reload from the store, which validated them
        when they were created)."""
        by_type: dict[ResourceType, dict[AclBinding, None]] = {}
        for acl in acls:
            by_type.setdefault(acl.resource_type, {})[acl] = None
        self._acls = by_type

    def add(self, acl: AclBinding) -> bool:
        """Add ``acl`` (validated first); False if it was already there (Kafka: creating an existing ACL succeeds).

        :raises InvalidAclError: see ``AclBinding.validate``.
        """
        acl.validate()
        by_type = self._acls.setdefault(acl.resource_type, {})
        if acl in by_type:
            return False
        by_type[acl] = None
        return True

    def describe(self, acl_filter: AclBindingFilter) -> list[AclBinding]:
        """The bindings ``acl_filter`` matches (DescribeAcls)."""
        return [acl for acl in self.acls if acl_filter.matches(acl)]

    def remove(self, acl_filter: AclBindingFilter) -> list[AclBinding]:
        """Remove and return the bindings ``acl_filter`` matches (DeleteAcls)."""
        removed = self.describe(acl_filter)
        self.discard(removed)
        return removed

    def discard(self, acls: Iterable[AclBinding]) -> None:
        """Remove these bindings; ones not there are ignored."""
        for acl in acls:
            self._acls.get(acl.resource_type, {}).pop(acl, None)

    def authorize(self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType,
                  name: str) -> bool:
        """May ``principal`` connected from ``host`` perform ``operation`` on resource ``name``?

        Kafka ``AclAuthorizer.authorizeAction``: super users always; else, with no
        ACL matching the resource, ``allow_everyone_if_no_acl_found``; else no
        matching DENY and at least one matching ALLOW (the module docstring has
        the matching rules).
        """
        if principal in self.super_users:
            return True
        matching = [acl for acl in self._acls.get(resource_type, ()) if acl.matches_resource(resource_type, name)]
        if not matching:
            return self.allow_everyone_if_no_acl_found
        applicable = [acl for acl in matching if acl._applies_to(principal, host)]
        for acl in applicable:
            if acl.permission == AclPermissionType.DENY and acl.operation in (operation, AclOperation.ALL):
                return False
        allowed_by = _IMPLIED_BY.get(operation, frozenset({operation}))
        return any(acl.permission == AclPermissionType.ALLOW
                   and (acl.operation == AclOperation.ALL or acl.operation in allowed_by)
                   for acl in applicable)

    def any_resource_allowed(self, principal: str, host: str, operation: AclOperation,
                             resource_type: ResourceType) -> bool:
        """Whether some resource of ``resource_type`` may get ``operation`` (KIP-679's "Write on any topic").

        Kafka ``Authorizer.authorizeByResourceType``: super users yes; else an
        ALLOW for the principal/host and operation (or ALL) on some pattern that
        no DENY of the same principal/host covers (a literal DENY covers that
        literal name, a prefixed DENY every pattern starting with its prefix, a
        ``*`` DENY everything). With no ACL of the type at all,
        ``allow_everyone_if_no_acl_found``.
        """
        if principal in self.super_users:
            return True
        acls = list(self._acls.get(resource_type, ()))
        if not acls:
            return self.allow_everyone_if_no_acl_found
        mine = [acl for acl in acls if acl._applies_to(principal, host)
                and acl.operation in (operation, AclOperation.ALL)]
        denies = [acl for acl in mine if acl.permission == AclPermissionType.DENY]

        def denied(acl: AclBinding) -> bool:
            for deny in denies:
                if deny.pattern_type == PatternType.LITERAL and deny.resource_name == WILDCARD:
                    return True
                if deny.pattern_type == PatternType.PREFIXED and acl.resource_name.startswith(deny.resource_name):
                    return True
                if (deny.pattern_type == PatternType.LITERAL and acl.pattern_type == PatternType.LITERAL
                        and deny.resource_name == acl.resource_name):
                    return True
            return False

        return any(acl.permission == AclPermissionType.ALLOW and not denied(acl) for acl in mine)


AUTHORIZER_NAMES = frozenset({
    "pipeline",
    "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "kafka.security.authorizer.AclAuthorizer",
})
"""``authorizer.class.name`` values that turn this authorizer on (Kafka's class names are
aliases, so a Kafka broker config works unchanged); empty: no authorizer."""
