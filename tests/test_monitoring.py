"""``replication status --check`` and ``replication verify``: their verdicts and bad-argument answers.

No services (two tests run the command in processes of their own); the end-to-end cases are in
faults/test_destinations_down.py and faults/test_misconfiguration.py."""

from __future__ import annotations

import pytest
from support.cli import run_cli

from replication.commands.status import check

NOW = 10_000.0


def instance(name: str, *, alive: bool = True, links: dict | None = None) -> dict:
    return {"instance": name, "alive": alive, "heartbeat_age_s": 1.0 if alive else 42.0, "max_seq": 10,
            "durable_seq": 10, "error": None, "stalled": {}, "links": links or {}}


def link(state: str = "connected", *, waiting_since: float | None = None, lag: float = 0.0, detail: str = "") -> dict:
    return {"state": state, "waiting_since": waiting_since, "lag_seconds": lag, "lag_messages": 3, "sent_seq": 9,
            "acked_seq": 7, "detail": detail}


def causes(statuses) -> list[tuple[str, str | None, str]]:
    return [(p.cause, p.instance, p.destination) for p in check(statuses, stall_after=60, max_lag=300, now=NOW)]


def test_a_healthy_fabric_passes():
    assert causes([instance("a", links={"b": link(waiting_since=NOW - 5, lag=2.0)}), instance("b")]) == []


def test_each_cause_is_named():
    assert causes([instance("b", alive=False)]) == [("down", "b", None)]
    assert causes([instance("a", links={"b": link("validation failed", detail="txlog: ...")})]) == [
        ("refused", "a", "b")]
    assert causes([instance("a", links={"b": link("config error", detail="format 2")})]) == [("refused", "a", "b")]
    assert causes([instance("a", links={"b": link(waiting_since=NOW - 61)})]) == [("stalled", "a", "b")]
    assert causes([instance("a", links={"b": link(lag=301.0)})]) == [("lagging", "a", "b")]


def test_a_down_instance_is_one_problem_not_one_per_link():
    assert causes([instance("a", alive=False, links={"b": link("instance down", waiting_since=0.0, lag=999.0)})]) == [
        ("down", "a", None)]


@pytest.mark.e2e  # CLI processes
def test_bad_arguments_exit_2_with_one_line_and_no_traceback(tmp_path):
    config = tmp_path / "a.xml"
    config.write_text("<AMPSConfig><Name>a</Name><Storage>/tmp/a</Storage></AMPSConfig>")
    bad_regex = run_cli("verify", str(config), "--topic", "(", process=True)
    assert bad_regex.code == 2 and "Traceback" not in bad_regex.err
    assert "--topic '(' is not a valid regular expression" in bad_regex.err
    assert len(bad_regex.err.strip().splitlines()) == 1 and bad_regex.out == ""
    bad_seconds = run_cli("status", str(config), "--check", "--stall-after", "soon", process=True)
    assert bad_seconds.code == 2 and "'soon' is not a number of seconds" in bad_seconds.err
    assert len(bad_seconds.err.strip().splitlines()) == 1 and "Traceback" not in bad_seconds.err
    missing = run_cli("verify", str(tmp_path / "nope.xml"), process=True)
    assert missing.code == 2 and "config file not found" in missing.err


@pytest.mark.e2e  # CLI processes
def test_a_never_started_instance_is_down_for_check_and_not_checked_for_verify(tmp_path):
    config = tmp_path / "a.xml"
    config.write_text(f"<AMPSConfig><Name>a</Name><Storage>{tmp_path / 'a'}</Storage></AMPSConfig>")
    status = run_cli("status", str(config), "--check", process=True)
    assert status.code == 1 and status.out.startswith("DOWN: a is not running"), status.out
    verify = run_cli("verify", str(config), process=True)
    assert verify.code == 0 and "0 links and 0 group pairs compared" in verify.out, verify.out


def test_an_instance_json_that_cannot_be_read_is_a_config_error_naming_the_file_and_the_fix(tmp_path):
    from replication.errors import ConfigError
    from replication.storage.control import read_instance_config

    broken = tmp_path / "instance.json"
    broken.write_text('{"name": "a", ')
    with pytest.raises(ConfigError, match=r"instance\.json is not valid JSON .*Fix: start that instance again"):
        read_instance_config(broken)
    broken.write_text('{"version": 1}')
    with pytest.raises(ConfigError, match=r"instance\.json: .*Fix: run the same version of replication"):
        read_instance_config(broken)
