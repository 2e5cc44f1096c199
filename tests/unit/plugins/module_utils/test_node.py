"""_node, the helpers of node_facts, on node reads recorded from the 2-node lab (tests/fixtures_record.py node ...)."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re

import pytest
from ansible.errors import AnsibleFilterError

from conftest import REPO, fixture_names, load_fixture
from ansible_collections.gpulab.vllm.plugins.filter.fabric import fabric_interface, fabric_problem
from ansible_collections.gpulab.vllm.plugins.module_utils import _node, _vllm_probe

NODES = fixture_names("node")
FABRIC_SUBNET = "10.220.0.0/24"
FABRIC_IF = "enp1s0f0np0"
# The lab's two networks: management on eth0, fabric on enp1s0f0np0.
ADDRESSES = {"gpl-node1": {"eth0": "10.210.0.11", FABRIC_IF: "10.220.0.11"},
             "gpl-node2": {"eth0": "10.210.0.12", FABRIC_IF: "10.220.0.12"}}
HOST = {"gpl-node1": "node1", "gpl-node2": "node2"}
CHAINS = ["INPUT", "FORWARD", "OUTPUT", "GPULAB-RAY", "GPULAB-ABSENT"]


def raw_links(name):
    return json.loads(load_fixture("node", name)["ip_address"]["stdout"])


def network_of(name):
    return _node.parse_ip_address_json(load_fixture("node", name)["ip_address"]["stdout"])


def fabric_up(name):
    return next(link for link in raw_links(name) if link["ifname"] == FABRIC_IF)["operstate"] == "UP"


NODES_FABRIC_UP = [name for name in NODES if fabric_up(name)]
IMAGE_NODES = [name for name in NODES if load_fixture("node", name)["docker"].get("images")]


def with_fabric_link(name, change):
    """The recorded `ip -j address show` of name with change applied to the fabric link."""
    links = copy.deepcopy(raw_links(name))
    change(next(link for link in links if link["ifname"] == FABRIC_IF))
    return json.dumps(links)


def test_fixtures_cover_the_situations():
    assert {"node1_nothing_deployed", "node2_nothing_deployed", "node1_deployed", "node2_deployed",
            "node2_fabric_down", "node2_fabric_unplugged"} <= set(NODES)
    assert IMAGE_NODES == NODES, "every node recording holds the daemon's answers about the lab's images"
    for name in NODES:
        record = load_fixture("node", name)
        assert record["netns"] in ADDRESSES, name
        for key in ("ip_address", "proc_net_tcp", "proc_net_tcp6", "ss_listening", "iptables"):
            assert record[key]["rc"] == 0 and record[key]["stdout"], (name, key, record[key]["stderr"])
        assert record["docker"]["listing"]["status"] == 200, name
        assert set(record["iptables_chains"]) == set(CHAINS), name


# ip -j address show -> network facts


@pytest.mark.parametrize("name", NODES)
def test_interfaces_and_addresses(name):
    record = load_fixture("node", name)
    network = network_of(name)
    links = raw_links(name)
    assert network["interfaces"] == [link["ifname"] for link in links] == ["lo", "eth0", FABRIC_IF]
    assert network["lo"]["ipv4"] == {"address": "127.0.0.1", "prefix": "8"}
    for iface, address in ADDRESSES[record["netns"]].items():
        assert network[iface]["device"] == iface
        assert network[iface]["ipv4"] == {"address": address, "prefix": "24"}
        assert network[iface]["ipv4_secondaries"] == []
    for link in links:
        info = network[link["ifname"]]
        assert (info["mtu"], info["macaddress"]) == (link["mtu"], link["address"])
        # IPv6 addresses (every link has one when up) are not IPv4 facts.
        assert not any(":" in entry["address"] for entry in [info.get("ipv4") or {"address": ""}] + info["ipv4_secondaries"])


@pytest.mark.parametrize("name", NODES)
def test_active_and_carrier_follow_the_link_flags_and_operstate(name):
    network = network_of(name)
    for link in raw_links(name):
        info = network[link["ifname"]]
        # Ansible's rule: active unless the kernel says the link is down.
        assert info["active"] is (link["operstate"] != "DOWN"), link["ifname"]
        # operstate is the kernel's own verdict; lo says UNKNOWN, as loopback always does.
        assert info["carrier"] is (link["operstate"] in ("UP", "UNKNOWN")), (link["ifname"], link["operstate"])
    assert network["lo"]["active"] and network["eth0"]["active"] and network["eth0"]["carrier"]


def test_recorded_fabric_down_is_inactive_without_carrier_and_keeps_its_address():
    info = network_of("node2_fabric_down")[FABRIC_IF]
    assert (info["active"], info["carrier"]) == (False, False)
    assert info["ipv4"]["address"] == "10.220.0.12"


def test_link_set_down_is_inactive_without_carrier():
    # As the kernel shows a link after `ip link set DEV down`: neither UP nor LOWER_UP, operstate DOWN.
    def set_down(link):
        link["flags"] = [flag for flag in link["flags"] if flag not in ("UP", "LOWER_UP")]
        link["operstate"] = "DOWN"
    info = _node.parse_ip_address_json(with_fabric_link("node2_deployed", set_down))[FABRIC_IF]
    assert (info["active"], info["carrier"]) == (False, False)
    assert info["ipv4"] == {"address": "10.220.0.12", "prefix": "24"}


def test_interface_names_become_fact_keys_as_in_ansible():
    assert _node.facts_key("eth0.100") == "eth0_100"
    assert _node.facts_key("br-lab:1") == "br_lab_1"
    text = with_fabric_link("node1_deployed", lambda link: link.update(ifname="enp1s0f0np0.100"))
    network = _node.parse_ip_address_json(text)
    assert "enp1s0f0np0.100" in network["interfaces"]
    assert network["enp1s0f0np0_100"]["device"] == "enp1s0f0np0.100"
    assert fabric_interface(network, FABRIC_SUBNET, "node1")["interface"] == "enp1s0f0np0.100"


def test_secondary_addresses_are_kept_in_order():
    def add(link):
        link["addr_info"].append({"family": "inet", "local": "10.220.0.111", "prefixlen": 24})
        link["addr_info"].append({"family": "inet", "local": "10.220.0.112", "prefixlen": 25})
    info = _node.parse_ip_address_json(with_fabric_link("node1_deployed", add))[FABRIC_IF]
    assert info["ipv4"]["address"] == "10.220.0.11"
    assert info["ipv4_secondaries"] == [{"address": "10.220.0.111", "prefix": "24"},
                                        {"address": "10.220.0.112", "prefix": "25"}]


def test_empty_listing_has_no_interfaces():
    assert _node.parse_ip_address_json("") == {"interfaces": []}
    assert _node.parse_ip_address_json("[]") == {"interfaces": []}


# The fabric filter on node_facts' network


@pytest.mark.parametrize("name", NODES_FABRIC_UP)
def test_fabric_interface_finds_the_fabric_link(name):
    netns = load_fixture("node", name)["netns"]
    address = ADDRESSES[netns][FABRIC_IF]
    network = network_of(name)
    # The lab's veths carry the kernel's default MTU, as recorded.
    expected = {"interface": FABRIC_IF, "address": address, "prefix": 24, "network": "10.220.0.0/24", "mtu": 1500}
    assert fabric_interface(network, FABRIC_SUBNET, HOST[netns]) == expected
    assert fabric_interface(network, FABRIC_SUBNET, HOST[netns], address) == expected
    assert fabric_interface(network, "10.210.0.0/24", HOST[netns]) == {
        "interface": "eth0", "address": ADDRESSES[netns]["eth0"], "prefix": 24, "network": "10.210.0.0/24", "mtu": 1500}
    with pytest.raises(AnsibleFilterError, match="has no address on the fabric subnet 192.168.200.0/24"):
        fabric_interface(network, "192.168.200.0/24", HOST[netns])


@pytest.mark.parametrize("name", NODES_FABRIC_UP)
def test_fabric_link_set_down_is_down(name):
    netns = load_fixture("node", name)["netns"]

    def set_down(link):
        # As the kernel shows a link after `ip link set DEV down`.
        link["flags"] = [flag for flag in link["flags"] if flag not in ("UP", "LOWER_UP")]
        link["operstate"] = "DOWN"
    text = with_fabric_link(name, set_down)
    with pytest.raises(AnsibleFilterError) as err:
        fabric_interface(_node.parse_ip_address_json(text), FABRIC_SUBNET, HOST[netns], ADDRESSES[netns][FABRIC_IF])
    assert str(err.value) == (
        "%s: the fabric interface %s (%s) is down; bring it up (ip link set %s up) and check its cable and switch port"
        % (HOST[netns], FABRIC_IF, ADDRESSES[netns][FABRIC_IF], FABRIC_IF))


def test_recorded_fabric_down_fails_as_the_integration_test_expects():
    with pytest.raises(AnsibleFilterError, match=re.escape("node2: the fabric interface enp1s0f0np0 (10.220.0.12) is down")):
        fabric_interface(network_of("node2_fabric_down"), FABRIC_SUBNET, "node2", "10.220.0.12")


def test_recorded_fabric_down_is_one_plain_sentence_for_the_assert():
    said = fabric_problem(network_of("node2_fabric_down"), FABRIC_SUBNET, "node2", "10.220.0.12")
    assert said == ("node2: the fabric interface enp1s0f0np0 (10.220.0.12) is down; bring it up (ip link set enp1s0f0np0 up) "
                    "and check its cable and switch port")
    assert fabric_problem(network_of("node2_nothing_deployed"), FABRIC_SUBNET, "node2", "10.220.0.12") == ""


def test_fabric_link_without_carrier_is_down_as_with_gathered_facts():
    def unplug(link):
        link["flags"] = ["NO-CARRIER"] + [flag for flag in link["flags"] if flag != "LOWER_UP"]
        link["operstate"] = "DOWN"
    network = _node.parse_ip_address_json(with_fabric_link("node2_deployed", unplug))
    assert (network[FABRIC_IF]["active"], network[FABRIC_IF]["carrier"]) == (False, False)
    with pytest.raises(AnsibleFilterError, match="is down"):
        fabric_interface(network, FABRIC_SUBNET, "node2", "10.220.0.12")


# /proc/net/tcp{,6} -> listening ports


def ss_ports(text):
    """(IPv4, IPv6) listening ports from `ss -Htln`; IPv6 local addresses are [..] or *."""
    v4, v6 = set(), set()
    for line in text.splitlines():
        local = line.split()[3]
        address, port = local.rsplit(":", 1)
        (v6 if address.startswith("[") or address == "*" else v4).add(int(port))
    return v4, v6


@pytest.mark.parametrize("name", NODES)
def test_listening_ports_agree_with_ss(name):
    record = load_fixture("node", name)
    v4, v6 = ss_ports(record["ss_listening"]["stdout"])
    assert _node.parse_proc_net_tcp(record["proc_net_tcp"]["stdout"]) == v4
    assert _node.parse_proc_net_tcp(record["proc_net_tcp6"]["stdout"]) == v6
    assert 22 in v4


def test_deployed_nodes_listen_on_rays_ports_and_the_head_on_vllms():
    ray = {6381, 6382, 6383, 6384, 6385, 6386}
    head = set(_node.parse_proc_net_tcp(load_fixture("node", "node1_deployed")["proc_net_tcp6"]["stdout"]))
    head |= _node.parse_proc_net_tcp(load_fixture("node", "node1_deployed")["proc_net_tcp"]["stdout"])
    worker = _node.parse_proc_net_tcp(load_fixture("node", "node2_deployed")["proc_net_tcp"]["stdout"])
    worker |= _node.parse_proc_net_tcp(load_fixture("node", "node2_deployed")["proc_net_tcp6"]["stdout"])
    assert ray | {6379, 8000, 10001, 22} <= head
    assert ray | {22} <= worker and not {6379, 8000} & worker
    idle = _node.parse_proc_net_tcp(load_fixture("node", "node1_nothing_deployed")["proc_net_tcp"]["stdout"])
    assert not (ray | {6379, 8000}) & idle


def test_sockets_that_do_not_listen_are_not_ports():
    # A deployed node has established connections: their local ports are in /proc/net/tcp but are no ports
    # for ss -l, nor for the parser.
    for name in ("node1_deployed", "node2_deployed"):
        record = load_fixture("node", name)
        connected = set()
        for key in ("proc_net_tcp", "proc_net_tcp6"):
            for line in record[key]["stdout"].splitlines()[1:]:
                fields = line.split()
                if fields[3] != "0A":
                    connected.add(int(fields[1].rsplit(":", 1)[1], 16))
        v4, v6 = ss_ports(record["ss_listening"]["stdout"])
        only_connected = connected - v4 - v6
        assert only_connected, name
        ports = (_node.parse_proc_net_tcp(record["proc_net_tcp"]["stdout"])
                 | _node.parse_proc_net_tcp(record["proc_net_tcp6"]["stdout"]))
        assert not only_connected & ports, name


def test_listening_ports_reads_both_files_and_skips_a_missing_one(tmp_path):
    record = load_fixture("node", "node1_deployed")
    (tmp_path / "tcp").write_text(record["proc_net_tcp"]["stdout"])
    tcp_only = _node.listening_ports(str(tmp_path))
    assert tcp_only == sorted(_node.parse_proc_net_tcp(record["proc_net_tcp"]["stdout"]))
    (tmp_path / "tcp6").write_text(record["proc_net_tcp6"]["stdout"])
    both = _node.listening_ports(str(tmp_path))
    assert both == sorted(set(tcp_only) | _node.parse_proc_net_tcp(record["proc_net_tcp6"]["stdout"]))
    assert len(both) > len(tcp_only)
    assert _node.listening_ports(str(tmp_path / "absent")) == []


def test_header_only_listing_has_no_ports():
    header = load_fixture("node", "node1_deployed")["proc_net_tcp"]["stdout"].splitlines()[0]
    assert _node.parse_proc_net_tcp(header + "\n") == set()
    assert _node.parse_proc_net_tcp("") == set()


# iptables -S -> rules per chain


@pytest.mark.parametrize("name", NODES)
def test_split_listing_is_what_iptables_prints_per_chain(name):
    record = load_fixture("node", name)
    rules = _node.split_iptables_listing(record["iptables"]["stdout"], CHAINS)
    for chain in CHAINS:
        alone = record["iptables_chains"][chain]
        expected = alone["stdout"].splitlines() if alone["rc"] == 0 else None
        assert rules[chain] == expected, (name, chain, alone["stderr"])
    assert rules["GPULAB-ABSENT"] is None
    assert rules["INPUT"][0] == "-P INPUT ACCEPT"


def test_ray_chain_present_when_deployed_absent_otherwise():
    for name in ("node1_deployed", "node2_deployed"):
        rules = _node.split_iptables_listing(load_fixture("node", name)["iptables"]["stdout"], CHAINS)
        assert rules["GPULAB-RAY"][0] == "-N GPULAB-RAY" and len(rules["GPULAB-RAY"]) == 4, name
        assert [rule for rule in rules["INPUT"] if rule.endswith("-j GPULAB-RAY")], name
    for name in ("node1_nothing_deployed", "node2_nothing_deployed"):
        rules = _node.split_iptables_listing(load_fixture("node", name)["iptables"]["stdout"], CHAINS)
        assert rules["GPULAB-RAY"] is None and rules["INPUT"] == ["-P INPUT ACCEPT"], name


def test_rules_of_a_chain_not_asked_for_are_left_out():
    listing = load_fixture("node", "node1_deployed")["iptables"]["stdout"]
    assert _node.split_iptables_listing(listing, []) == {}
    only = _node.split_iptables_listing(listing, ["GPULAB-RAY"])
    assert list(only) == ["GPULAB-RAY"]
    assert not any(rule.startswith("-A INPUT") for rule in only["GPULAB-RAY"])


# Docker: listing and inspect -> containers


def replay_docker(record):
    """A docker_get that answers each path with the recorded status and body; an unrecorded path fails."""
    answers = {record["docker"]["listing"]["path"]: record["docker"]["listing"]}
    answers.update((item["path"], item) for item in record["docker"]["inspect"].values())
    answers.update((item["path"], item) for item in record["docker"].get("images", {}).values())

    def docker_get(docker_host, path, timeout):
        assert docker_host == record["docker_host"]
        return answers[path]["status"], answers[path]["body"]

    return docker_get


@pytest.mark.parametrize("name", NODES)
def test_summaries_agree_with_the_listing(name):
    record = load_fixture("node", name)
    listing = record["docker"]["listing"]["body"]
    for entry in listing:
        container = entry["Names"][0].lstrip("/")
        doc = record["docker"]["inspect"][container]
        assert doc["status"] == 200
        summary = _node.summarize_inspect(doc["body"], record["label"])
        assert summary["exists"] is True
        assert summary["status"] == entry["State"]
        assert summary["running"] is (entry["State"] == "running")
        assert summary["image_id"] == entry["ImageID"]
        assert summary["labels"] == entry["Labels"]
        assert summary["role"] == entry["Labels"][record["label"]]
        assert summary["started_at"] == doc["body"]["State"]["StartedAt"]
        assert summary["exit_code"] == doc["body"]["State"]["ExitCode"]
        assert set(summary) == set(_node.absent_container())


@pytest.mark.parametrize("name", NODES)
def test_docker_containers_on_the_recorded_daemon(name, monkeypatch):
    record = load_fixture("node", name)
    monkeypatch.setattr(_node, "docker_get", replay_docker(record))
    missing = record["missing_container"]
    containers = _node.docker_containers(record["docker_host"], record["label"], ["gpulab-ray-head", missing], 10)
    listed = [entry["Names"][0].lstrip("/") for entry in record["docker"]["listing"]["body"]]
    assert list(containers) == listed + [n for n in ["gpulab-ray-head", missing] if n not in listed]
    assert record["docker"]["inspect"][missing]["status"] == 404
    assert containers[missing] == _node.absent_container()
    for container, doc in record["docker"]["inspect"].items():
        if doc["status"] == 404:
            assert containers[container]["exists"] is False, container


def test_deployed_roles_and_states():
    def containers(name):
        record = load_fixture("node", name)
        return dict((c, _node.summarize_inspect(doc["body"], record["label"]) if doc["status"] == 200
                     else _node.absent_container()) for c, doc in record["docker"]["inspect"].items())
    head = containers("node1_deployed")
    assert (head["gpulab-ray-head"]["role"], head["gpulab-ray-head"]["running"]) == ("ray-head", True)
    assert (head["gpulab-vllm"]["role"], head["gpulab-vllm"]["running"]) == ("vllm-server", True)
    assert head["gpulab-ray-head"]["image_id"].startswith("sha256:")
    worker = containers("node2_deployed")
    assert (worker["gpulab-ray-worker"]["role"], worker["gpulab-ray-worker"]["running"]) == ("ray-worker", True)
    assert worker["gpulab-ray-head"]["exists"] is False
    for name in ("node1_nothing_deployed", "node2_nothing_deployed"):
        assert load_fixture("node", name)["docker"]["listing"]["body"] == []
        assert containers(name)["gpulab-ray-head"] == _node.absent_container()


def test_stopped_container_is_not_running():
    record = load_fixture("node", "node1_deployed")
    doc = copy.deepcopy(record["docker"]["inspect"]["gpulab-ray-head"]["body"])
    doc["State"].update(Status="exited", Running=False, ExitCode=137)
    summary = _node.summarize_inspect(doc, record["label"])
    assert (summary["exists"], summary["running"], summary["status"], summary["exit_code"]) == (True, False, "exited", 137)
    assert _node.summarize_inspect({}, record["label"])["role"] is None


def test_absent_container_is_all_empty():
    absent = _node.absent_container()
    assert absent["exists"] is False and absent["running"] is False and absent["labels"] == {}
    assert absent["role"] is None and absent["image_id"] is None
    absent["labels"]["x"] = "y"
    assert _node.absent_container()["labels"] == {}


def test_daemon_error_names_status_and_message(monkeypatch):
    record = load_fixture("node", "node1_nothing_deployed")
    missing = record["docker"]["inspect"][record["missing_container"]]["body"]
    monkeypatch.setattr(_node, "docker_get", lambda host, path, timeout: (500, missing))
    with pytest.raises(_node.DockerError, match="listing containers answered HTTP 500: No such container"):
        _node.docker_containers(record["docker_host"], record["label"], [], 10)


def test_daemon_that_cannot_be_asked(tmp_path):
    with pytest.raises(_node.DockerError, match="must start with unix:// or tcp://"):
        _node.docker_get("ssh://node1", "/containers/json", 1)
    with pytest.raises(_node.DockerError, match="No such file or directory"):
        _node.docker_get("unix://%s" % (tmp_path / "docker.sock"), "/containers/json", 1)


# describe_file


def sha1_of(data):
    return hashlib.sha1(data).hexdigest()


def test_file_mode_owner_and_matching_content(tmp_path):
    token = tmp_path / "ray_token"
    token.write_bytes(b"not-a-real-token\n")
    token.chmod(0o600)
    described = _node.describe_file(str(token), sha1_of(b"not-a-real-token\n"))
    assert described == {"exists": True, "isdir": False, "mode": "0600", "uid": os.getuid(), "gid": os.getgid(),
                         "matches": True}
    assert _node.describe_file(str(token), sha1_of(b"not-a-real-token\n").upper())["matches"] is True
    assert _node.describe_file(str(token), sha1_of(b"another-token\n"))["matches"] is False
    assert _node.describe_file(str(token))["matches"] is None
    token.chmod(0o640)
    assert _node.describe_file(str(token))["mode"] == "0640"


def test_digest_of_a_file_that_holds_no_secret(tmp_path):
    """Asked with digest, the read returns the SHA-1 a role compares with what it would write; none for a folder or an
    absent file, and the field only when asked."""
    listing = tmp_path / "ray_non_carry_over_env_vars.json"
    listing.write_bytes(b'[\n  "NCCL_IB_HCA"\n]\n')
    assert _node.describe_file(str(listing), digest=True)["sha1"] == sha1_of(b'[\n  "NCCL_IB_HCA"\n]\n')
    assert "sha1" not in _node.describe_file(str(listing))
    assert _node.describe_file(str(tmp_path), digest=True)["sha1"] is None
    assert _node.describe_file(str(tmp_path / "absent"), digest=True)["sha1"] is None


def test_missing_file(tmp_path):
    missing = str(tmp_path / "absent")
    assert _node.describe_file(missing) == {"exists": False, "isdir": False, "mode": None, "uid": None, "gid": None,
                                            "matches": None}
    assert _node.describe_file(missing, sha1_of(b""))["matches"] is False


def test_directory(tmp_path):
    folder = tmp_path / "secrets"
    folder.mkdir()
    folder.chmod(0o700)
    described = _node.describe_file(str(folder), sha1_of(b""))
    assert (described["exists"], described["isdir"], described["mode"], described["matches"]) == (True, True, "0700", False)
    assert _node.describe_file(str(folder))["matches"] is None


# No secret in a fixture


def test_secret_environment_is_redacted():
    seen = []
    for name in NODES:
        record = load_fixture("node", name)
        for container, doc in record["docker"]["inspect"].items():
            for entry in ((doc["body"] or {}).get("Config") or {}).get("Env") or []:
                key, _sep, value = entry.partition("=")
                if key in ("VLLM_API_KEY", "RAY_AUTH_TOKEN", "HF_TOKEN"):
                    seen.append((name, container, key))
                    assert value == "REDACTED", (name, container, key)
    # The vLLM server of the deployed lab has an API key: the check above saw it.
    assert ("node1_deployed", "gpulab-vllm", "VLLM_API_KEY") in seen
    assert "docker.inspect.gpulab-vllm.body.Config.Env VLLM_API_KEY" in load_fixture("node", "node1_deployed")["redacted"]


@pytest.mark.parametrize("name", IMAGE_NODES)
def test_docker_images_on_the_recorded_daemon(name, monkeypatch):
    record = load_fixture("node", name)
    monkeypatch.setattr(_node, "docker_get", replay_docker(record))
    refs = list(record["docker"]["images"])
    images = _node.docker_images(record["docker_host"], refs, 10)
    assert list(images) == refs
    assert images[record["missing_image"]] == {"present": False, "id": None, "repo_digests": [], "entrypoint": [],
                                               "os": None, "architecture": None, "variant": None, "error": None,
                                               "registry": None}
    present = [ref for ref in refs if ref != record["missing_image"]]
    assert present, "the recording holds none of the lab's images"
    for ref in present:
        body = record["docker"]["images"][ref]["body"]
        assert images[ref] == {"present": True, "id": body["Id"], "repo_digests": body["RepoDigests"],
                               "entrypoint": body["Config"]["Entrypoint"] or [], "os": "linux", "architecture": "amd64",
                               "variant": None, "error": None, "registry": None}
        # The lab pins its images by digest: the node knows the image under that very reference.
        assert ref in images[ref]["repo_digests"]
        assert images[ref]["id"].startswith("sha256:")


def test_recorded_unplugged_cable_is_down_as_ansible_would_say():
    """The switch side of node2's fabric link down: the node's interface stays administratively up, without
    carrier, and the kernel calls it down; Ansible's facts would say active=false, and so does node_facts."""
    link = next(link for link in raw_links("node2_fabric_unplugged") if link["ifname"] == FABRIC_IF)
    assert "UP" in link["flags"] and "NO-CARRIER" in link["flags"]
    info = network_of("node2_fabric_unplugged")[FABRIC_IF]
    assert (info["active"], info["carrier"]) == (False, False)
    with pytest.raises(AnsibleFilterError, match=re.escape("node2: the fabric interface enp1s0f0np0 (10.220.0.12) is down")):
        fabric_interface(network_of("node2_fabric_unplugged"), FABRIC_SUBNET, "node2", "10.220.0.12")


def test_no_fixture_holds_a_path_of_the_lab_checkout():
    """The recorders rewrite the lab's folders (node files, node image stores) to a real node's."""
    folders = [REPO / "tests" / "unit" / "fixtures", REPO / "bench" / "tests" / "fixtures"]
    fixtures = [path for folder in folders for path in sorted(folder.rglob("*")) if path.is_file()]
    assert len(fixtures) > 10
    for path in fixtures:
        text = path.read_text(errors="replace")
        for piece in ("/build/cache/", "/build/lab/", str(REPO)):
            assert piece not in text, (path.relative_to(REPO), piece)


# Container logs as the Engine API sends them (recorded with curl from a vLLM container that exited)

LOG_STREAM = REPO / "tests" / "unit" / "fixtures" / "node" / "logs_vllm_missing_model.stream"


def test_log_stream_frames_become_the_containers_text_in_order():
    raw = LOG_STREAM.read_bytes()
    assert raw[0] in (1, 2) and raw[1:4] == b"\x00\x00\x00", "the recording is a multiplexed stream"
    text = _node.split_log_stream(raw)
    lines = text.splitlines()
    # Every frame's payload and nothing of the headers: as many bytes as the frames announce.
    size, offset, frames = 0, 0, 0
    while offset < len(raw):
        length = int.from_bytes(raw[offset + 4:offset + 8], "big")
        size, offset, frames = size + length, offset + 8 + length, frames + 1
    assert offset == len(raw) and len(text.encode()) == size and frames >= 5
    assert "\x00" not in text
    # stderr (the traceback) and stdout (vLLM's own log lines) interleaved as written: the cause is last.
    assert lines[-1].startswith("huggingface_hub.errors.HFValidationError: Repo id must be in the form")
    assert any(line.startswith("Traceback (most recent call last):") for line in lines)
    assert _vllm_probe.last_error_line(text).startswith("huggingface_hub.errors.HFValidationError")


def test_log_of_a_tty_container_is_plain_text():
    assert _node.split_log_stream(b"plain text\n") == "plain text\n"
    assert _node.split_log_stream(b"") == ""


def test_controller_address_is_found_above_a_become_that_dropped_it():
    """sudo drops SSH_CLIENT from the module's environment; the shell above it still holds it."""
    import subprocess
    import sys

    code = ("import sys; sys.path.insert(0, %r); "
            "from ansible_collections.gpulab.vllm.plugins.module_utils._node import controller_address; "
            "print(controller_address())") % str(REPO / "build" / "collections")
    env = {"PATH": "/usr/bin:/bin", "SSH_CLIENT": "10.210.0.1 54321 22"}
    below = subprocess.run(["bash", "-c", 'env -u SSH_CLIENT "$0" -c "$1"; exit $?', sys.executable, code], env=env,
                           capture_output=True, text=True, check=True)
    assert below.stdout.strip() == "10.210.0.1"
    direct = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert direct.stdout.strip() == "10.210.0.1"
    none = subprocess.run(["bash", "-c", 'env -u SSH_CLIENT "$0" -c "$1"; exit $?', sys.executable, code],
                          env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True)
    # Whatever started this test run is no SSH session of a controller here... unless it is: then its address.
    assert none.stdout.strip() in ("None", _node.controller_address())


def test_a_validation_error_is_named_with_the_check_that_failed():
    """pydantic puts the model on the error's line and the failed check below it: both make the cause."""
    record = load_fixture("vllm", "vllm_bad_max_model_len")
    line = _node.cause_line(record["log"])
    assert line.startswith("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig: "
                           "Value error, User-specified max_model_len (100000) is greater than the derived max_model_len")
    assert "errors.pydantic.dev" not in line
    assert len(line) <= 303
