"""Authentication of replication links: ``<Authentication>`` on the incoming transport, ``<Authenticator>`` on a
destination's transport, as AMPS places them (spec/replication.txt, "Replication Security").

An upstream signs each commit it writes into a downstream inbox with a key it shares with that
downstream; the downstream takes only commits that verify (:mod:`replication.inbox.signing`)::

    <Transport>                                   <!-- the downstream's incoming transport -->
      <Name>amps-replication</Name><Type>amps-replication</Type>
      <Authentication>
        <Module>replication-hmac-authentication</Module>
        <Upstream><Name>amps-1</Name><Key>${AMPS1_LINK_KEY}</Key></Upstream>
        <Upstream><Name>amps-3</Name><KeyFile>keys/amps-3.key</KeyFile></Upstream>
      </Authentication>
    </Transport>

    <Destination>...<Transport>                    <!-- the upstream's destination -->
      <Type>amps-replication</Type><InetAddr>...</InetAddr>
      <Authenticator>
        <Module>replication-hmac-authenticator</Module>
        <Key>${AMPS1_LINK_KEY}</Key>
      </Authenticator>
    </Transport></Destination>

The same transport's ``<Entitlement>`` (module ``replication-topic-entitlement``) lists which upstream
instances or groups may replicate which topics in (:mod:`replication.inbox.entitlement`)::

    <Entitlement>
      <Module>replication-topic-entitlement</Module>
      <Upstream><Name>amps-1</Name><Topic>^/orders/</Topic></Upstream>
      <Upstream><Group>ny-tier</Group><Topic>.*</Topic></Upstream>
    </Entitlement>

AMPS's default modules (``amps-default-authentication-module``, ``amps-default-authenticator-module``,
``amps-default-entitlement-module``) are accepted and do what they do in AMPS: admit everyone,
present no credentials, allow everything. Keys come from the environment (exactly ``${VAR}``) or a
file, never from the config file itself, and are read at start.
"""

from __future__ import annotations

from replication.config import values
from replication.config.model import InstanceConfig, Source, UpstreamEntitlement
from replication.config.security import secret
from replication.config.xml_reader import MANY, OPT, Node, one, some
from replication.connectors.kafka.security import Secret
from replication.errors import ConfigError

__all__ = ["authentication", "authenticator", "check_link_keys", "entitlement"]

#: Shortest key accepted: HMAC-SHA256 keys shorter than this are guessable.
MIN_KEY_BYTES = 16

DEFAULT_AUTHENTICATION = "amps-default-authentication-module"
HMAC_AUTHENTICATION = "replication-hmac-authentication"
DEFAULT_AUTHENTICATOR = "amps-default-authenticator-module"
HMAC_AUTHENTICATOR = "replication-hmac-authenticator"
DEFAULT_ENTITLEMENT = "amps-default-entitlement-module"
TOPIC_ENTITLEMENT = "replication-topic-entitlement"

_KEY = "a replication link key"
_AUTHENTICATION_SCHEMA = {"Module": one(f"<Module>{HMAC_AUTHENTICATION}</Module>"), "Upstream": MANY}
_UPSTREAM_SCHEMA = {"Name": one("<Name>amps-1</Name>"), "Key": OPT, "KeyFile": OPT}
_AUTHENTICATOR_SCHEMA = {"Module": one(f"<Module>{HMAC_AUTHENTICATOR}</Module>"), "Key": OPT, "KeyFile": OPT}
_ENTITLEMENT_SCHEMA = {"Module": one(f"<Module>{TOPIC_ENTITLEMENT}</Module>"), "Upstream": MANY}
_ENTITLED_UPSTREAM_SCHEMA = {"Name": OPT, "Group": OPT, "Topic": some("<Topic>^/orders/</Topic>")}


def _module(node: Node, known: tuple[str, ...], what: str) -> str:
    module_node = node.children({"Module": one(f"<Module>{known[-1]}</Module>"), "Upstream": MANY, "Key": OPT,
                                 "KeyFile": OPT}).one("Module")
    module = module_node.text()
    if module not in known:
        module_node.fail(f"the {what} module '{module}' is not supported yet: this engine implements "
                         f"{' and '.join(known)}",
                         f"write <Module>{known[-1]}</Module> (see the README's replication security section)")
    return module


def _upstreams(node: Node, what: str, schema: dict, default: str, custom: str, *, default_does: str,
               custom_use: str, none_given: str, example: str) -> list[Node] | None:
    """The ``<Upstream>`` elements of an ``<Authentication>`` or ``<Entitlement>`` whose module is ``custom``
    (at least one); None for AMPS's ``default`` module, which takes none."""
    module = _module(node, (default, custom), what)
    upstreams = node.children(schema).all("Upstream")
    if module == default:
        if upstreams:
            upstreams[0].fail(f"{default} {default_does}",
                              f"write <Module>{custom}</Module> {custom_use}, or remove the <Upstream> elements")
        return None
    if not upstreams:
        node.fail(f"{custom} {none_given}", example)
    return upstreams


def authentication(node: Node | None) -> tuple[tuple[str, Secret], ...] | None:
    """``<Authentication>`` of the incoming transport: the upstreams admitted and their keys; None: every
    inbox commit is taken (no element, or AMPS's default module)."""
    if node is None:
        return None
    upstreams = _upstreams(
        node, "authentication", _AUTHENTICATION_SCHEMA, DEFAULT_AUTHENTICATION, HMAC_AUTHENTICATION,
        default_does="admits every upstream: <Upstream> keys are not used by it",
        custom_use="to verify signed commits",
        none_given="admits the upstreams it holds keys for, and none is given",
        example="add <Upstream><Name>amps-1</Name><Key>${AMPS1_LINK_KEY}</Key></Upstream> per upstream instance")
    if upstreams is None:
        return None
    keys: dict[str, Secret] = {}
    lines: dict[str, int] = {}
    for unode in upstreams:
        ukids = unode.children(_UPSTREAM_SCHEMA)
        name_node = ukids.one("Name")
        name = name_node.text()
        if name in lines:
            name_node.fail(f"upstream '{name}' already has a key at line {lines[name]}", "keep one <Upstream> per name")
        key = secret(ukids.opt("Key"), ukids.opt("KeyFile"), "Key", _KEY)
        if key is None:
            unode.fail(f"upstream '{name}' has no key", "add <Key>${LINK_KEY}</Key> or <KeyFile>path</KeyFile>")
        keys[name], lines[name] = key, unode.line
    return tuple(sorted(keys.items()))


def authenticator(node: Node | None) -> Secret | None:
    """``<Authenticator>`` of a destination's transport: the key its commits are signed with (None: unsigned)."""
    if node is None:
        return None
    module = _module(node, (DEFAULT_AUTHENTICATOR, HMAC_AUTHENTICATOR), "authenticator")
    kids = node.children(_AUTHENTICATOR_SCHEMA)
    key = secret(kids.opt("Key"), kids.opt("KeyFile"), "Key", _KEY)
    if module == DEFAULT_AUTHENTICATOR:
        if key is not None:
            node.fail(f"{DEFAULT_AUTHENTICATOR} presents no credentials: a key is not used by it",
                      f"write <Module>{HMAC_AUTHENTICATOR}</Module> to sign this link's commits, or remove the key")
        return None
    if key is None:
        node.fail(f"{HMAC_AUTHENTICATOR} signs with a key, and none is given",
                  "add <Key>${LINK_KEY}</Key> or <KeyFile>path</KeyFile> (the key the destination holds for "
                  "this instance)")
    return key


def entitlement(node: Node | None) -> tuple[UpstreamEntitlement, ...] | None:
    """``<Entitlement>`` of the incoming transport: who may replicate which topics in; None: everything is
    allowed (no element, or AMPS's default module)."""
    if node is None:
        return None
    upstreams = _upstreams(
        node, "entitlement", _ENTITLEMENT_SCHEMA, DEFAULT_ENTITLEMENT, TOPIC_ENTITLEMENT,
        default_does="allows everything: <Upstream> rules are not used by it",
        custom_use="to entitle upstreams by topic",
        none_given="admits the upstreams it lists, and none is listed",
        example="add <Upstream><Name>amps-1</Name><Topic>.*</Topic></Upstream> per upstream (or <Group> for a "
                "group of them)")
    if upstreams is None:
        return None
    rules = []
    for unode in upstreams:
        kids = unode.children(_ENTITLED_UPSTREAM_SCHEMA)
        name, group = kids.opt("Name"), kids.opt("Group")
        if (name is None) == (group is None):
            unode.fail("an entitled <Upstream> names one instance (<Name>) or one group (<Group>)",
                       "keep exactly one of <Name> and <Group>")
        topics = tuple(t.read(values.regex) for t in kids.all("Topic"))
        rules.append(UpstreamEntitlement(name=name.text() if name is not None else None,
                                         group=group.text() if group is not None else None,
                                         topics=topics, source=unode.source()))
    return tuple(rules)


def check_link_keys(cfg: InstanceConfig) -> None:
    """At start: every link key can be read and is long enough; a :class:`ConfigError` naming the element
    and the fix otherwise (never the key)."""
    transport = cfg.replication_transport
    checks: list[tuple[Secret, str, Source]] = []
    if transport is not None and transport.upstream_keys is not None:
        checks += [(key, f"<Authentication> key of upstream {name}", transport.source)
                   for name, key in transport.upstream_keys]
    checks += [(d.signing_key, f"<Authenticator> key of destination {d.name}", d.source)
               for d in cfg.destinations if d.signing_key is not None]
    for key, what, source in checks:
        try:
            check_key(key.reveal().encode(), what)
        except ValueError as exc:
            raise ConfigError(f"{source}: {what}: {exc}. Fix: export the variable or write the key file "
                              "(a random key of 32 bytes or more, e.g. `openssl rand -hex 32`)",
                              file=source.file, line=source.line or None) from None


def check_key(key: bytes, what: str) -> None:
    """ValueError when ``key`` is too short to sign with."""
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"{what} is {len(key)} bytes long; a signing key needs at least {MIN_KEY_BYTES}")


def verifying_keys(cfg: InstanceConfig) -> dict[str, bytes] | None:
    """Upstream name -> key bytes, when the incoming transport verifies signed commits; else None."""
    transport = cfg.replication_transport
    if transport is None or transport.upstream_keys is None:
        return None
    return {name: key.reveal().encode() for name, key in transport.upstream_keys}
