"""The authorizer's rules (Kafka AclAuthorizer.authorizeAction), filters and the SQLite store."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.security.acl import (WILDCARD, WILDCARD_PRINCIPAL, AclBinding, AclBindingFilter, AclOperation,
                                   AclPermissionType, Authorizer, InvalidAclError, PatternType, ResourceType,
                                   parse_super_users)
from pipeline.security.acl_store import AclStore

T, G, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
Op = AclOperation
ALICE, BOB = "User:alice", "User:bob"


def acl(name="t", op=Op.WRITE, perm=ALLOW, principal=ALICE, host="*", rtype=T, pattern=LIT) -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, host, op, perm)


def test_no_acl_found_follows_the_setting():
    assert not Authorizer().authorize(ALICE, "1.2.3.4", Op.WRITE, T, "t")
    assert Authorizer(allow_everyone_if_no_acl_found=True).authorize(ALICE, "1.2.3.4", Op.WRITE, T, "t")
    # An ACL on the resource for someone else means "ACLs found": alice is denied even then.
    a = Authorizer([acl(principal=BOB)], allow_everyone_if_no_acl_found=True)
    assert not a.authorize(ALICE, "h", Op.WRITE, T, "t")
    assert a.authorize(ALICE, "h", Op.WRITE, T, "other")  # no ACL matches "other"


def test_super_users_may_do_anything_even_when_denied():
    a = Authorizer([acl(perm=DENY, principal="User:admin", op=Op.ALL)], super_users=parse_super_users(
        " User:admin ; User:ops;"))
    assert a.super_users == {"User:admin", "User:ops"}
    assert a.authorize("User:admin", "h", Op.WRITE, T, "t")
    assert a.authorize("User:ops", "h", Op.ALTER, C, "kafka-cluster")
    with pytest.raises(InvalidAclError):
        parse_super_users("admin")


def test_deny_wins_and_wildcards_match():
    a = Authorizer([acl(op=Op.ALL, principal=WILDCARD_PRINCIPAL), acl(perm=DENY, host="10.0.0.9")])
    assert a.authorize(ALICE, "10.0.0.1", Op.WRITE, T, "t")
    assert not a.authorize(ALICE, "10.0.0.9", Op.WRITE, T, "t")
    assert a.authorize(BOB, "10.0.0.9", Op.WRITE, T, "t")  # the DENY names alice
    assert a.authorize(ALICE, "10.0.0.9", Op.READ, T, "t")  # ...and Write only


def test_implied_operations():
    for granted in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER):
        a = Authorizer([acl(op=granted)])
        assert a.authorize(ALICE, "h", Op.DESCRIBE, T, "t"), granted
        assert not a.authorize(ALICE, "h", Op.CREATE, T, "t")
    a = Authorizer([acl(op=Op.ALTER_CONFIGS)])
    assert a.authorize(ALICE, "h", Op.DESCRIBE_CONFIGS, T, "t")
    assert not a.authorize(ALICE, "h", Op.ALTER_CONFIGS, T, "u")
    # Implication widens ALLOW only: a DENY of Read leaves Describe allowed by an ALL.
    a = Authorizer([acl(op=Op.ALL), acl(op=Op.READ, perm=DENY)])
    assert a.authorize(ALICE, "h", Op.DESCRIBE, T, "t") and not a.authorize(ALICE, "h", Op.READ, T, "t")


def test_literal_wildcard_and_prefixed_patterns():
    a = Authorizer([acl(name="orders-", pattern=PRE), acl(name=WILDCARD, op=Op.READ, principal=BOB)])
    assert a.authorize(ALICE, "h", Op.WRITE, T, "orders-eu")
    assert not a.authorize(ALICE, "h", Op.WRITE, T, "order")
    assert a.authorize(BOB, "h", Op.READ, T, "anything")
    assert not a.authorize(BOB, "h", Op.READ, G, "anything")  # resource types are separate


def test_any_resource_allowed_for_kip_679():
    assert Authorizer([acl(name="x")]).any_resource_allowed(ALICE, "h", Op.WRITE, T)
    assert not Authorizer([acl(name="x"), acl(name="x", perm=DENY)]).any_resource_allowed(ALICE, "h", Op.WRITE, T)
    assert not Authorizer([acl(name="x-y"), acl(name="x", pattern=PRE, perm=DENY)]).any_resource_allowed(
        ALICE, "h", Op.WRITE, T)
    assert not Authorizer([acl(name="x", op=Op.READ)]).any_resource_allowed(ALICE, "h", Op.WRITE, T)
    assert Authorizer(allow_everyone_if_no_acl_found=True).any_resource_allowed(ALICE, "h", Op.WRITE, T)


def test_validation_refuses_what_kafka_refuses():
    for bad in (acl(rtype=ResourceType.ANY), acl(pattern=PatternType.MATCH), acl(op=Op.ANY),
                acl(perm=AclPermissionType.ANY), acl(principal="alice"), acl(host=""), acl(name="")):
        with pytest.raises(InvalidAclError):
            Authorizer().add(bad)
    with pytest.raises(InvalidAclError):
        AclBindingFilter(operation=Op.UNKNOWN).validate()


def test_filters_any_match_and_exact():
    lit, star, pre = acl(name="orders"), acl(name=WILDCARD), acl(name="ord", pattern=PRE)
    a = Authorizer([lit, star, pre, acl(name="g", rtype=G, op=Op.READ)])
    assert a.describe(AclBindingFilter(resource_type=T, resource_name="orders", pattern_type=PatternType.MATCH)) \
        == [lit, star, pre]
    assert a.describe(AclBindingFilter(resource_type=T, resource_name="orders")) == [lit]
    assert a.describe(AclBindingFilter(pattern_type=PRE)) == [pre]
    assert len(a.describe(AclBindingFilter())) == 4
    assert a.remove(AclBindingFilter(resource_type=G)) and len(a.acls) == 3
    assert a.add(lit) is False  # already there


# -- properties -----------------------------------------------------------------------------

NAMES = ["t", "tx", "orders", "orders-eu", WILDCARD]
names = st.sampled_from(NAMES)
principals = st.sampled_from([ALICE, BOB, WILDCARD_PRINCIPAL])
hosts = st.sampled_from(["*", "10.0.0.1", "10.0.0.2"])
ops = st.sampled_from([o for o in Op if o not in (Op.UNKNOWN, Op.ANY)])
bindings = st.builds(AclBinding, st.sampled_from([T, G]), names, st.sampled_from([LIT, PRE]), principals, hosts,
                     ops, st.sampled_from([ALLOW, DENY]))
requests = st.tuples(st.sampled_from([ALICE, BOB]), st.sampled_from(["10.0.0.1", "10.0.0.2"]),
                     st.sampled_from([o for o in Op if o not in (Op.UNKNOWN, Op.ANY, Op.ALL)]),
                     st.sampled_from([T, G]), st.sampled_from(["t", "tx", "orders", "orders-eu", "x"]))


@settings(max_examples=300)
@given(st.lists(bindings, max_size=8), requests)
def test_deny_always_wins(acls, req):
    principal, host, op, rtype, name = req
    a = Authorizer(acls)
    a.add(AclBinding(rtype, name, LIT, principal, host, op, DENY))
    assert not a.authorize(principal, host, op, rtype, name)


@settings(max_examples=300)
@given(st.lists(bindings, max_size=8), requests, st.booleans())
def test_adding_an_allow_never_takes_access_away_and_a_deny_never_grants(acls, req, everyone):
    principal, host, op, rtype, name = req
    before = Authorizer(acls, allow_everyone_if_no_acl_found=everyone).authorize(principal, host, op, rtype, name)
    denied = Authorizer(acls, allow_everyone_if_no_acl_found=everyone)
    denied.add(AclBinding(rtype, name, PRE, WILDCARD_PRINCIPAL, "*", Op.ALL, DENY))
    assert not denied.authorize(principal, host, op, rtype, name)
    if before and any(x.matches_resource(rtype, name) for x in acls):
        allowed = Authorizer(acls, allow_everyone_if_no_acl_found=everyone)
        allowed.add(AclBinding(rtype, WILDCARD, LIT, principal, "*", Op.READ, ALLOW))
        assert allowed.authorize(principal, host, op, rtype, name)


@settings(max_examples=300)
@given(st.lists(bindings, max_size=8), requests)
def test_an_allow_all_for_the_principal_grants_unless_denied(acls, req):
    principal, host, op, rtype, name = req
    a = Authorizer([x for x in acls if x.permission == ALLOW])
    a.add(AclBinding(rtype, name, LIT, principal, host, Op.ALL, ALLOW))
    assert a.authorize(principal, host, op, rtype, name)
    # The implied operation: any of Read/Write/Delete/Alter allows Describe.
    b = Authorizer([AclBinding(rtype, name, LIT, principal, "*", Op.READ, ALLOW)])
    assert b.authorize(principal, host, Op.DESCRIBE, rtype, name)


@settings(max_examples=200)
@given(st.lists(bindings, max_size=8), st.sampled_from([T, G, ResourceType.ANY]), st.sampled_from(NAMES + [None]))
def test_remove_removes_exactly_what_describe_lists(acls, rtype, name):
    a = Authorizer(acls)
    f = AclBindingFilter(resource_type=rtype, resource_name=name)
    listed = a.describe(f)
    before = a.acls
    assert a.remove(f) == listed
    assert a.acls == [x for x in before if x not in listed]


def test_store_survives_reopen(metadata_target):
    path = metadata_target("acls.db")
    store = AclStore(path)
    kept, gone = acl(name="orders", pattern=PRE), acl(perm=DENY, host="10.0.0.9")
    store.add([kept, gone, kept])
    store.remove([gone])
    store.close()
    reopened = AclStore(path)
    assert reopened.load() == [kept]
    if isinstance(path, str):  # PostgreSQL: no journal mode to check
        reopened.close()
        return
    import sqlite3
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    reopened.close()
