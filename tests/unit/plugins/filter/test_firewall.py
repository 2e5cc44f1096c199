"""The default-deny chain, compared with what iptables and ip6tables printed after the role's restore input, after
an operator's ACCEPT put ahead of it, and after the repair (tests/unit/fixtures/firewall, recorded by
tests/fixtures_record_firewall.py in a scratch network namespace)."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from conftest import load_fixture

from ansible_collections.gpulab.vllm.plugins.filter.firewall import (
    CHAIN, JUMP, firewall_drift, firewall_restore, firewall_rules)
from ansible_collections.gpulab.vllm.plugins.module_utils._node import split_iptables_listing


@pytest.mark.parametrize("family", [4, 6])
def test_the_rules_are_what_iptables_prints(family):
    record = load_fixture("firewall", f"ipv{family}")
    wanted = firewall_rules(family, record["fabric"], record["ssh_port"], record["openings"])
    applied = split_iptables_listing(record["listings"]["applied"], ["INPUT", CHAIN])
    assert [rule for rule in applied[CHAIN] if rule.startswith("-A")] == wanted
    assert firewall_drift(applied, wanted) == []
    repaired = split_iptables_listing(record["listings"]["repaired"], ["INPUT", CHAIN])
    assert firewall_drift(repaired, wanted) == []
    # The operator's rule stays, behind the jump, where it admits nothing the chain refuses.
    assert [rule for rule in repaired["INPUT"] if rule.startswith("-A")] == [JUMP, "-A INPUT -i eth0 -j ACCEPT"]


@pytest.mark.parametrize("family", [4, 6])
def test_an_accept_ahead_of_the_jump_is_drift(family):
    record = load_fixture("firewall", f"ipv{family}")
    wanted = firewall_rules(family, record["fabric"], record["ssh_port"], record["openings"])
    drifted = split_iptables_listing(record["listings"]["drifted"], ["INPUT", CHAIN])
    assert firewall_drift(drifted, wanted) == [
        f"the jump to {CHAIN} is not the first rule of INPUT (first: -A INPUT -i eth0 -j ACCEPT)"]
    restore = firewall_restore(wanted, drifted)
    # One jump deleted and one put first; the chain declared (emptied) and written whole.
    assert restore.splitlines()[:3] == ["*filter", f":{CHAIN} - [0:0]", JUMP.replace("-A", "-D", 1)]
    assert restore.splitlines()[-2:] == [JUMP.replace("-A INPUT", "-I INPUT 1", 1), "COMMIT"]


def test_families_and_sources():
    fabric = {"interface": "enp1s0f0np0", "network": "10.220.0.0/24"}
    v4 = firewall_rules(4, fabric, 2222, [{"name": "vllm clients", "port": 8000, "sources": ["10.210.0.7", "::1"]}])
    v6 = firewall_rules(6, fabric, 2222, [{"name": "vllm clients", "port": 8000, "sources": ["10.210.0.7", "::1"]}])
    assert any("--dport 2222" in rule for rule in v4) and any("--dport 2222" in rule for rule in v6)
    assert any(rule.startswith(f"-A {CHAIN} -s 10.210.0.7/32 -p tcp") for rule in v4)
    assert any(rule.startswith(f"-A {CHAIN} -s ::1/128 -p tcp") for rule in v6)
    # The fabric subnet is IPv4: over IPv6 the fabric admits nothing.
    assert not any("the fabric subnet" in rule for rule in v6)
    assert any("nothing else on the fabric" in rule for rule in v6)
    with pytest.raises(AnsibleFilterError, match="not an address or network"):
        firewall_rules(4, fabric, 22, [{"name": "x", "port": 1, "sources": ["office"]}])


def test_a_node_without_the_chain():
    wanted = firewall_rules(4, {"interface": "eth1", "network": "10.0.0.0/24"}, 22)
    assert firewall_drift({"INPUT": ["-P INPUT ACCEPT"], CHAIN: None}, wanted) == [
        f"no {CHAIN} chain", f"the jump to {CHAIN} is not the first rule of INPUT"]


@pytest.mark.parametrize("family", [4, 6])
def test_status_reads_the_shape_without_knowing_the_openings(family):
    record = load_fixture("firewall", f"ipv{family}")
    assert firewall_drift(split_iptables_listing(record["listings"]["applied"], ["INPUT", CHAIN])) == []
    assert firewall_drift(split_iptables_listing(record["listings"]["drifted"], ["INPUT", CHAIN])) == [
        f"the jump to {CHAIN} is not the first rule of INPUT (first: -A INPUT -i eth0 -j ACCEPT)"]
