"""The least-privileged ACL user docs/redis.md documents allows every command the store's scripts
call: a script refused one fails every call of it, on a path the integration test may not take."""

from __future__ import annotations

import re

import redis

from bridge.store.redis_errors import describe_redis_error
from tests.conftest import ROOT

LUA = ROOT / "bridge" / "store" / "lua"
CALL = re.compile(r"""redis\.p?call\(\s*['"]([A-Za-z]+)['"]""")


def documented_rules() -> set[str]:
    text = (ROOT / "docs" / "redis.md").read_text()
    [line] = [x for x in text.splitlines() if x.startswith("ACL SETUSER delay-bridge on ")]
    return {rule.lower() for rule in line.split() if rule.startswith("+")}


def script_commands() -> dict[str, set[str]]:
    """Each command a script calls, with the scripts calling it."""
    calls: dict[str, set[str]] = {}
    for script in sorted(LUA.glob("*.lua")):
        for command in CALL.findall(script.read_text()):
            calls.setdefault(command.lower(), set()).add(script.name)
    return calls


def test_the_scripts_are_read() -> None:
    calls = script_commands()
    assert {"zadd", "zrangebyscore", "hset", "time"} <= set(calls), sorted(calls)


def test_every_command_a_script_calls_is_allowed_to_the_documented_user() -> None:
    allowed = documented_rules()
    missing = {f"+{c}": sorted(s) for c, s in script_commands().items() if f"+{c}" not in allowed}
    assert not missing, f"docs/redis.md's ACL user lacks {missing}"


def test_a_command_refused_inside_a_script_is_named_as_the_acl_user_lacking_it() -> None:
    # Redis 7's reply when a script calls a command its user lacks (no NOPERM code in it).
    refused = redis.exceptions.ResponseError(
        "The user executing the script can't run this command or subcommand script: dc78..., "
        "on @user_script:1180."
    )
    assert describe_redis_error(refused).startswith("redis refused permission (NOPERM)")
    assert describe_redis_error(redis.exceptions.ResponseError("WRONGTYPE")) == "redis: WRONGTYPE"
