"""The dev cluster: pure config generation and option parsing (no root), then the real
cluster (marked `cluster`; skipped without root, slurm-wlm and munge)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import paramiko
import pytest

from trainctl.cli import main
from trainctl.devcluster import cluster as devcluster_cluster
from trainctl.devcluster import faults
from trainctl.devcluster import processes as devcluster_processes
from trainctl.devcluster.cli import parse_node_assignments, spec_from_options
from trainctl.devcluster.cluster import (ClusterSpec, DevCluster, gres_conf_text, known_hosts_text,
                                        mounts_under, parse_link_mtu, parse_sinfo_node_states,
                                        parse_tbf_rate_bits, pid_alive, slurm_conf_text,
                                        spec_for_instance, sshd_config_text, task_prolog_text)
from trainctl.devcluster.slurm_root import (DEBIAN_MIRROR, check_root, host_binds, mmdebstrap_argv,
                                            write_client_wrappers)
from trainctl.devcluster.spec import SLURM_ROOTS, Layout
from trainctl.errors import ExternalCommandError, PrivilegeError, UsageError
from trainctl.proc import run, run_checked


def conf_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def conf_settings(text: str) -> dict[str, str]:
    """Single `Key=value` lines of a Slurm config (node and partition lines left out)."""
    return dict(line.split("=", 1) for line in conf_lines(text) if " " not in line)


# ---------------------------------------------------------------- config generation

def test_slurm_conf_declares_controller_nodes_partition_and_prolog():
    spec = ClusterSpec(nodes=3, base_dir="/tmp/dc-x", subnet="10.77.5", slurmctld_port=6900)
    text = slurm_conf_text(spec, controller_hostname="vm")
    settings = conf_settings(text)

    assert settings["SlurmctldHost"] == "vm(10.77.5.254)"
    assert settings["SlurmctldPort"] == "6900"
    assert settings["AuthInfo"] == "socket=/tmp/dc-x/run/munge.sock"
    assert settings["TaskProlog"] == "/tmp/dc-x/task_prolog.sh"
    # Three slurmd share one filesystem: their spool, pid and log files must be per node.
    for key in ("SlurmdSpoolDir", "SlurmdPidFile", "SlurmdLogFile"):
        assert "%n" in settings[key]
    nodes = [line for line in conf_lines(text) if line.startswith("NodeName=")]
    assert nodes == [
        f"NodeName=node{i} NodeAddr=10.77.5.{i} NodeHostname=node{i} CPUs=16 Boards=1 "
        f"SocketsPerBoard=1 CoresPerSocket=16 ThreadsPerCore=1 RealMemory=4000 Gres=gpu:8 "
        f"State=UNKNOWN" for i in (1, 2, 3)]
    partitions = [line for line in conf_lines(text) if line.startswith("PartitionName=")]
    assert partitions == ["PartitionName=gpu Nodes=node[1-3] Default=YES MaxTime=INFINITE State=UP"]


def test_a_domain_gives_nodes_fqdn_hostnames_but_keeps_their_node_names():
    spec = ClusterSpec(nodes=2, domain="cluster.test")
    assert [spec.hostname(n) for n in spec.node_names] == ["node1.cluster.test", "node2.cluster.test"]
    nodes = [line.split()[:3] for line in conf_lines(slurm_conf_text(spec, "vm"))
             if line.startswith("NodeName=")]
    assert nodes == [["NodeName=node1", "NodeAddr=10.77.0.1", "NodeHostname=node1.cluster.test"],
                     ["NodeName=node2", "NodeAddr=10.77.0.2", "NodeHostname=node2.cluster.test"]]
    assert "Nodes=node[1-2] " in slurm_conf_text(spec, "vm")  # partitions and jobs use NodeName
    assert ClusterSpec(nodes=2).hostname("node2") == "node2"


def test_slurm_conf_without_gpus_declares_no_gres_on_nodes():
    text = slurm_conf_text(ClusterSpec(nodes=1, gpus_per_node=0), controller_hostname="vm")
    node_lines = [line for line in conf_lines(text) if line.startswith("NodeName=")]
    assert len(node_lines) == 1 and "Gres=" not in node_lines[0]
    assert "Nodes=node1 " in text


@pytest.mark.parametrize("gpus, expected", [
    (8, ["AutoDetect=off", "NodeName=node[1-4] Name=gpu File=/dev/tcgpu[0-7]"]),
    (1, ["AutoDetect=off", "NodeName=node[1-4] Name=gpu File=/dev/tcgpu0"]),
    (0, ["AutoDetect=off"]),
])
def test_gres_conf_lists_fake_gpu_device_files(gpus, expected):
    assert conf_lines(gres_conf_text(ClusterSpec(gpus_per_node=gpus))) == expected


@pytest.mark.parametrize("path, exported", [
    ("/usr/bin:/bin", "export PATH=/tmp/dc-x/local/bin:/usr/bin:/bin\n"),
    # a batch step's PATH, passed on by srun to every node: already right, left alone
    ("/tmp/dc-x/local/bin:/usr/bin:/bin", ""),
    ("/tmp/dc-x/local/bin", ""),
    ("/tmp/dc-x/local/binx:/bin", "export PATH=/tmp/dc-x/local/bin:/tmp/dc-x/local/binx:/bin\n"),
])
def test_task_prolog_puts_the_node_local_bin_dir_first_once(tmp_path, path, exported):
    script = tmp_path / "prolog.sh"
    script.write_text(task_prolog_text(ClusterSpec(base_dir="/tmp/dc-x")))
    for node in ("node1", "node2"):  # the same path on every node: nothing node-specific to leak
        result = run_checked(["/bin/sh", str(script)], timeout=10, env={"SLURMD_NODENAME": node, "PATH": path})
        assert result.stdout == exported


def test_sshd_config_sets_slurm_conf_and_the_pitfall_options():
    lines = conf_lines(sshd_config_text("/tmp/dc-x/ssh", "/tmp/dc-x/slurm.conf"))
    settings = dict(line.split(" ", 1) for line in lines)
    assert settings["SetEnv"] == "SLURM_CONF=/tmp/dc-x/slurm.conf"
    assert settings["UsePAM"] == "no"
    assert settings["StrictModes"] == "no"
    assert settings["PasswordAuthentication"] == "no"
    assert settings["AuthorizedKeysFile"] == "/tmp/dc-x/ssh/authorized_keys"


def test_sshd_sessions_of_a_cluster_on_a_slurm_root_find_its_clients_first():
    lines = conf_lines(sshd_config_text("/tmp/dc-x/ssh", "/tmp/dc-x/slurm.conf", "/tmp/dc-x/slurm-bin"))
    settings = dict(line.split(" ", 1) for line in lines)
    session_env = dict(item.split("=", 1) for item in settings["SetEnv"].split())
    assert session_env["SLURM_CONF"] == "/tmp/dc-x/slurm.conf"
    assert session_env["PATH"].split(":")[0] == "/tmp/dc-x/slurm-bin"
    assert "/usr/bin" in session_env["PATH"].split(":")


def test_known_hosts_pins_the_host_key_for_every_node_address(tmp_path):
    key = paramiko.RSAKey.generate(1024)
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(known_hosts_text(["10.77.0.1", "10.77.0.2"],
                                            f"{key.get_name()} {key.get_base64()} comment\n"))
    host_keys = paramiko.HostKeys(str(known_hosts))
    for address in ("10.77.0.1", "10.77.0.2"):
        assert host_keys.check(address, key)
    assert host_keys.lookup("10.77.0.3") is None


# ---------------------------------------------------------------- spec and option parsing

def test_spec_defaults_give_node1_a_different_mtu_and_distinct_names():
    spec = ClusterSpec()
    assert [spec.mtu(n) for n in spec.node_names] == [1500, 9000, 9000, 9000]
    assert ClusterSpec(mtus={"node1": 9000}).mtu("node1") == 9000
    assert (spec.netns("node3"), spec.veth("node3"), spec.bridge) == ("tcn3", "tcveth3", "tcbr0")
    assert spec.address("node3") == "10.77.0.3" and spec.controller_address == "10.77.0.254"
    longest = ClusterSpec(nodes=64, prefix="abcdef")
    assert len(longest.veth("node64")) <= 15  # the Linux limit on interface names


def test_rails_get_their_own_interface_bridge_veth_and_subnet():
    spec = ClusterSpec(rails=2, subnet="10.77.4", prefix="te")
    assert (spec.rail_interface(1), spec.rail_bridge(1), spec.veth("node3", 1)) == ("eth1", "tebr1", "teveth3r1")
    assert spec.address("node3", 1) == "10.77.14.3" and spec.address("node3") == "10.77.4.3"
    longest = ClusterSpec(nodes=64, prefix="abcdef", rails=4)
    assert len(longest.veth("node64", 3)) <= 15  # the Linux limit on interface names
    assert spec_from_options(4, "/tmp/dc-x", (), (), rails=2).rails == 2


@pytest.mark.parametrize("changes, message", [
    ({"nodes": 0}, "nodes must be"),
    ({"base_dir": "relative/dir"}, "base dir"),
    ({"base_dir": "/tmp/with space"}, "base dir"),
    ({"base_dir": "/tmp"}, "base dir"),  # would make `down` delete /tmp
    ({"subnet": "10.77"}, "subnet"),
    ({"prefix": "toolongprefix"}, "prefix"),
    ({"mtus": {"node5": 1500}}, "unknown node 'node5'"),
    ({"mtus": {"node2": 9200}}, "MTU for node2"),
    ({"rates": {"node2": "fast"}}, "rate for node2"),
    ({"partition": "gpu queue"}, "partition"),
    ({"domain": "Cluster.Test"}, "domain"),
    ({"domain": "cluster..test"}, "domain"),
    ({"domain": "a" * 60}, "domain"),  # node1.aaa... would pass Linux's 64-character limit
    ({"rails": 0}, "rails must be"),
    ({"rails": 5}, "rails must be"),
    ({"subnet": "10.77.250", "rails": 2}, "no room for 2 rails"),
    ({"slurm": "23.02"}, "Slurm '23.02' is not one the dev cluster runs"),
    ({"slurm": "24.11", "slurm_root": "relative/root"}, "relative/root"),
    ({"slurm": "24.11", "root_binds": ("/data with space",)}, "/data with space"),
])
def test_spec_validation_names_the_bad_setting(changes, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        ClusterSpec(**changes).validate()


def test_spec_round_trips_through_its_state_file_form():
    spec = ClusterSpec(nodes=2, mtus={"node2": 1500}, rates={"node1": "1gbit"})
    assert ClusterSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    on_root = ClusterSpec(slurm="24.11", root_binds=("/data",))
    assert ClusterSpec.from_dict(json.loads(json.dumps(on_root.to_dict()))) == on_root


def test_the_instance_slurm_comes_from_the_environment_and_the_option_wins(monkeypatch):
    monkeypatch.delenv("TRAINCTL_DEVCLUSTER_SLURM", raising=False)
    assert spec_for_instance(2).slurm == "system" and not spec_for_instance(2).uses_root
    monkeypatch.setenv("TRAINCTL_DEVCLUSTER_SLURM", "24.11")
    assert spec_for_instance(2).slurm == "24.11" and spec_for_instance(0).uses_root
    assert spec_from_options(4, "/tmp/dc-x", (), ()).slurm == "24.11"
    assert spec_from_options(4, "/tmp/dc-x", (), (), slurm="system").slurm == "system"
    monkeypatch.setenv("TRAINCTL_DEVCLUSTER_SLURM", "25.11")
    with pytest.raises(UsageError, match="TRAINCTL_DEVCLUSTER_SLURM: Slurm '25.11'"):
        spec_for_instance(2)


def test_each_slurm_release_has_its_own_root_and_26_05_is_pinned_in_debian_sid():
    assert ClusterSpec(slurm="24.11").root_fs != ClusterSpec(slurm="26.05").root_fs
    assert ClusterSpec(slurm="26.05", slurm_root="/data/root").root_fs == "/data/root"
    # switching the release of a spec switches its root along
    assert dataclasses.replace(ClusterSpec(slurm="24.11"), slurm="26.05").root_fs == SLURM_ROOTS["26.05"]
    sid = mmdebstrap_argv("26.05", "/tmp/target")
    assert sid[-3:] == ["sid", "/tmp/target", DEBIAN_MIRROR]
    assert "slurm-wlm=26.05.5-1" in sid[sid.index("--variant=minbase") + 2]
    assert 'Acquire::Check-Valid-Until "false"' in sid[2]
    trixie = mmdebstrap_argv("24.11", "/tmp/target")
    assert trixie[-3] == "trixie" and not any("Valid-Until" in arg for arg in trixie)


def test_the_slurm_root_sees_tmp_and_trainctls_python_but_never_replaces_its_own_system():
    binds = host_binds(("/data", "/data/sub", "/usr/local/share"),
                       python_prefix="/work/repo/.venv", python_base="/root/.pyenv/versions/3.11.7")
    # the venv's checkout covers the venv; nested and system directories are left out
    assert binds == ["/data", "/root/.pyenv/versions/3.11.7", "/tmp", "/work/repo"]
    assert host_binds(python_prefix="/usr", python_base="/usr") == ["/tmp"]


def test_job_commands_refuse_a_directory_the_slurm_root_cannot_see(tmp_path):
    layout = Layout(ClusterSpec(base_dir=str(tmp_path / "dc"), slurm="24.11"))
    layout.base.mkdir()
    write_client_wrappers(layout)
    elsewhere = tmp_path / "elsewhere"   # not below <base>/root: the root does not see it
    elsewhere.mkdir()
    srun = subprocess.run([str(layout.slurm_bin_dir / "srun"), "-N1", "hostname"], cwd=elsewhere,
                          capture_output=True, text=True, timeout=10)
    assert srun.returncode == 1
    assert srun.stderr.startswith(f"srun: {elsewhere} is not visible inside the dev cluster's Slurm root")


def test_a_cluster_on_a_root_that_is_not_built_says_how_to_build_it(tmp_path):
    with pytest.raises(ExternalCommandError, match="is not built") as raised:
        check_root("24.11", str(tmp_path))
    assert "scripts/setup --slurm 24.11" in raised.value.hint
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/trainctl-slurm-root").write_text("24.11 24.11.5\n")
    check_root("24.11", str(tmp_path))


def test_up_on_a_root_that_is_not_built_touches_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(devcluster_cluster, "check_prerequisites", lambda **_: None)  # root or not
    spec = ClusterSpec(base_dir=str(tmp_path / "dc"), prefix="tq", slurm="24.11",
                       slurm_root=str(tmp_path / "none"))
    with pytest.raises(ExternalCommandError, match="is not built"):
        DevCluster(spec).up()
    assert not (tmp_path / "dc").exists() and not os.path.exists("/sys/class/net/tqbr0")


def test_mtu_and_rate_options_become_the_spec():
    spec = spec_from_options(4, "/tmp/dc-x", ("node3=1500", "node1=9000"), ("node2=1gbit",))
    assert [spec.mtu(n) for n in spec.node_names] == [9000, 9000, 1500, 9000]
    assert spec.rate("node2") == "1gbit" and spec.rate("node1") is None
    assert spec.domain == "" and spec.base_dir == "/tmp/dc-x"


def test_up_options_build_on_the_instance_spec(monkeypatch):
    monkeypatch.setenv("TRAINCTL_DEVCLUSTER_INSTANCE", "3")
    spec = spec_from_options(2, None, (), (), "cluster.test")
    instance = spec_for_instance(3)
    assert (spec.base_dir, spec.subnet, spec.prefix, spec.slurmctld_port) == (
        instance.base_dir, instance.subnet, instance.prefix, instance.slurmctld_port)
    assert spec.hostname("node2") == "node2.cluster.test"


@pytest.mark.parametrize("values, message", [
    (("node2",), "expected NODE=VALUE"),
    (("node2=",), "expected NODE=VALUE"),
    (("=9000",), "expected NODE=VALUE"),
    (("node2=1500", "node2=9000"), "given twice for node2"),
])
def test_node_assignments_reject_malformed_values(values, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        parse_node_assignments(values, "--mtu")


@pytest.mark.parametrize("argv, message", [
    (["--mtu", "node2=jumbo"], "--mtu node2=jumbo: the MTU must be a whole number"),
    (["--mtu", "node9=1500"], "unknown node 'node9'"),
    (["--nodes", "2", "--rate", "node3=1gbit"], "unknown node 'node3'"),
    (["--rate", "node2=fast"], "rate for node2"),
])
def test_cli_up_rejects_bad_options_in_one_line_before_touching_anything(argv, message, capsys):
    assert main(["dev-cluster", "up", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainctl: error: ") and message in err
    assert len(err.strip().splitlines()) == 1


def test_missing_prerequisites_say_exactly_what_is_missing(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(devcluster_processes, "SBIN_DIRS", str(tmp_path))
    problems = devcluster_processes.missing_prerequisites()
    assert problems[0].startswith("not root (euid 1000)")
    assert "slurmd" in problems[1] and "munged" in problems[1]
    with pytest.raises(PrivilegeError):
        devcluster_processes.check_prerequisites()


# ---------------------------------------------------------------- pure parsers

def test_parsers_read_sinfo_ip_and_tc_output():
    assert parse_sinfo_node_states("node1|idle\nnode2|drained\nnode3|idle*\n") == {
        "node1": "idle", "node2": "drained", "node3": "idle*"}
    assert parse_link_mtu('[{"ifname":"eth0","mtu":9000,"operstate":"UP"}]') == 9000
    # Captured from `tc -j qdisc show` after `tbf rate 100mbit burst 256kb`: rate in bytes/s.
    tbf = ('[{"kind":"tbf","handle":"8001:","root":true,"refcnt":3,'
           '"options":{"rate":12500000,"burst":262137,"lat":400000}}]')
    assert parse_tbf_rate_bits(tbf) == 100_000_000
    assert parse_tbf_rate_bits("[]") is None
    assert parse_tbf_rate_bits('[{"kind":"noqueue","handle":"0:","root":true,"options":{}}]') is None


def test_mounts_under_finds_our_mounts_deepest_first_and_skips_look_alikes():
    mountinfo = (
        "22 1 8:1 / / rw - ext4 /dev/vda rw\n"
        "40 22 0:4 net:[1] /tmp/dc/ns rw - ext4 /dev/vda rw\n"
        "41 40 0:4 uts:[2] /tmp/dc/ns/node1.uts rw - nsfs nsfs rw\n"
        "42 22 0:4 / /tmp/dc-other/ns rw - ext4 /dev/vda rw\n"
        "43 22 0:4 / /tmp/dc/odd\\040name rw - tmpfs tmpfs rw\n")
    assert mounts_under(mountinfo, "/tmp/dc") == [
        "/tmp/dc/ns/node1.uts", "/tmp/dc/ns", "/tmp/dc/odd name"]


# ---------------------------------------------------------------- the real cluster

def srun(cluster: DevCluster, *args: str, timeout: float = 60) -> str:
    return run_checked(["srun", *args], timeout=timeout, env=cluster.client_env(), cwd="/tmp").stdout


def by_task(output: str) -> dict[int, str]:
    """`srun -l` output -> {task id: its line}."""
    return {int(line.split(":", 1)[0]): line.split(":", 1)[1].strip()
            for line in output.splitlines() if ":" in line}


def slurm_states(cluster: DevCluster) -> dict[str, str]:
    out = run_checked(["sinfo", "-h", "-N", "-o", "%N|%T"], timeout=15, env=cluster.client_env())
    return parse_sinfo_node_states(out.stdout)


@pytest.mark.cluster
def test_cluster_is_up_with_four_idle_nodes_and_live_daemons(devcluster):
    assert slurm_states(devcluster) == {f"node{i}": "idle" for i in (1, 2, 3, 4)}
    status = devcluster.status()
    assert status.slurmctld_alive and status.munged_alive
    address = devcluster.spec.address
    assert [(n.name, n.address, n.mtu, n.rate_bit_s, n.slurmd_alive) for n in status.nodes] == [
        ("node1", address("node1"), 1500, None, True), ("node2", address("node2"), 9000, None, True),
        ("node3", address("node3"), 9000, None, True), ("node4", address("node4"), 9000, None, True)]
    json.dumps(status.as_dict())  # `status --json` relies on it


def expected_slurm_version(cluster: DevCluster) -> str:
    """`slurm-wlm X.Y.Z` of the Slurm the cluster was asked for."""
    if cluster.spec.uses_root:
        release = (Path(cluster.spec.root_fs) / "etc/trainctl-slurm-root").read_text().split()[1]
        assert release.startswith(f"{cluster.spec.slurm}."), release
        return f"slurm-wlm {release}"
    return run_checked([devcluster_processes.binary("slurmd"), "-V"], timeout=15).stdout.strip()


@pytest.mark.cluster
def test_daemons_clients_and_job_steps_all_run_the_slurm_asked_for(devcluster, tmp_path):
    expected = expected_slurm_version(devcluster)
    client = run_checked(["scontrol", "--version"], timeout=15, env=devcluster.client_env())
    assert client.stdout.strip() == expected
    tasks = by_task(srun(devcluster, "-N4", "-l", "scontrol", "--version"))
    assert tasks == {i: expected for i in range(4)}
    batch = run_checked(["sbatch", "--wait", "-N2", "-o", str(tmp_path / "out"), "--wrap",
                         "srun -l sinfo --version"], timeout=60, env=devcluster.client_env(), cwd=tmp_path)
    assert batch.returncode == 0
    assert by_task((tmp_path / "out").read_text()) == {0: expected, 1: expected}
    release = expected.split()[-1]
    for log in ("slurmctld", *(f"slurmd-{node}" for node in devcluster.spec.node_names)):
        assert f"version {release} started" in (devcluster.log_dir / f"{log}.log").read_text()


@pytest.mark.cluster
def test_each_srun_task_sees_its_own_node_hostname_address_and_mtu(devcluster):
    out = srun(devcluster, "-N4", "--ntasks-per-node=1", "-l", "sh", "-c",
               "echo $(hostname) $(cat /sys/class/net/eth0/mtu) $(ip -4 -o addr show dev eth0)")
    seen = {}
    for line in by_task(out).values():
        hostname, mtu, _, _, family, address = line.split()[:6]
        assert family == "inet"
        seen[hostname] = (address, int(mtu))
    assert seen == {node: (f"{devcluster.spec.address(node)}/24", 1500 if node == "node1" else 9000)
                    for node in devcluster.spec.node_names}


@pytest.mark.cluster
def test_fake_gpus_are_allocated_per_node(devcluster):
    out = srun(devcluster, "-N2", "--gpus-per-node=4", "-l", "sh", "-c",
               'echo "$CUDA_VISIBLE_DEVICES $SLURM_GPUS_ON_NODE"')
    assert sorted(by_task(out).values()) == ["0,1,2,3 4", "0,1,2,3 4"]


@pytest.mark.cluster
def test_node_bin_dir_shadows_a_command_on_that_node_only(devcluster):
    fake = devcluster.node_bin_dir("node2") / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho \"replayed nvidia-smi on $(hostname)\"\n")
    fake.chmod(0o755)
    try:
        found = by_task(srun(devcluster, "-N4", "--ntasks-per-node=1", "-l", "sh", "-c",
                             'echo "$(hostname) $(command -v nvidia-smi || echo none)"'))
        seen_at = devcluster.layout.local_bin_dir / "nvidia-smi"
        assert sorted(found.values()) == ["node1 none", f"node2 {seen_at}", "node3 none", "node4 none"]
        assert srun(devcluster, "-w", "node2", "nvidia-smi") == "replayed nvidia-smi on node2\n"
    finally:
        fake.unlink()


LEAK_PROBE = """#!/bin/sh
srun --ntasks-per-node=1 -l sh -c 'echo "$(hostname) $(command -v nvidia-smi || echo none) $PATH"'
"""


@pytest.mark.cluster
def test_inside_a_batch_job_each_node_sees_only_its_own_bin_dir(devcluster, tmp_path):
    """srun passes the batch host's PATH to every node: node1's commands must not come with it."""
    fake = devcluster.node_bin_dir("node1") / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho replayed\n")
    fake.chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(LEAK_PROBE)
    try:
        run_checked(["sbatch", "--wait", "-N4", "-o", str(tmp_path / "out"), str(script)], timeout=60,
                    env=devcluster.client_env(), cwd=str(tmp_path))
    finally:
        fake.unlink()
    found = by_task((tmp_path / "out").read_text())
    local_bin = str(devcluster.layout.local_bin_dir)
    assert sorted(line.split()[:2] for line in found.values()) == [
        ["node1", f"{local_bin}/nvidia-smi"], ["node2", "none"], ["node3", "none"], ["node4", "none"]]
    for line in found.values():  # one node-local entry, first, and no node's own path
        path = line.split()[2].split(":")
        assert path[0] == local_bin and path.count(local_bin) == 1
        assert not any("/nodes/" in entry for entry in path)


RECEIVER = """
import socket, sys
server = socket.create_server(("0.0.0.0", int(sys.argv[1])))
server.settimeout(60)
conn, _ = server.accept()
received = 0
while chunk := conn.recv(1 << 16):
    received += len(chunk)
conn.sendall(b"ok")
print(received)
"""

SENDER = """
import socket, sys, time
host, port, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
deadline = time.monotonic() + 20
while True:  # the receiver may not listen yet
    try:
        conn = socket.create_connection((host, port), timeout=60)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
payload = b"x" * size
start = time.perf_counter()
conn.sendall(payload)
conn.shutdown(socket.SHUT_WR)
assert conn.recv(2) == b"ok"
print(time.perf_counter() - start)
"""


def timed_transfer(cluster: DevCluster, source: str, target: str, size: int, port: int) -> float:
    """Seconds for `size` bytes to go over TCP from node `source` to node `target`."""
    received = {}
    receiver = threading.Thread(target=lambda: received.update(result=run(
        cluster.exec_argv(target, [sys.executable, "-c", RECEIVER, str(port)]), timeout=90)))
    receiver.start()
    sender = run_checked(cluster.exec_argv(source, [
        sys.executable, "-c", SENDER, cluster.spec.address(target), str(port), str(size)]), timeout=90)
    receiver.join()
    assert received["result"].ok and int(received["result"].stdout) == size, received["result"]
    return float(sender.stdout)


@pytest.mark.cluster
def test_rate_limited_node_is_slower_in_both_directions(devcluster):
    size = 8 * 1024 * 1024
    devcluster.set_rate("node2", "50mbit")
    try:
        assert [n.rate_bit_s for n in devcluster.status().nodes] == [None, 50_000_000, None, None]
        from_slow = timed_transfer(devcluster, "node2", "node1", size, port=5301)
        to_slow = timed_transfer(devcluster, "node3", "node2", size, port=5302)
        unshaped = timed_transfer(devcluster, "node3", "node1", size, port=5303)
    finally:
        devcluster.set_rate("node2", None)
    # 8 MiB at 50 Mbit/s needs 1.34 s (less a 256 kB burst); a veth moves it in milliseconds.
    # Ratios, not absolute times, for the fast side: this machine is shared and noisy.
    assert from_slow > 1.0 and to_slow > 1.0
    assert from_slow / unshaped > 3 and to_slow / unshaped > 3
    assert devcluster.status().nodes[1].rate_bit_s is None


@pytest.mark.cluster
def test_mtu_change_is_seen_by_jobs_on_that_node(devcluster):
    devcluster.set_mtu("node3", 1500)
    try:
        assert srun(devcluster, "-w", "node3", "cat", "/sys/class/net/eth0/mtu") == "1500\n"
        assert devcluster.status().nodes[2].mtu == 1500
    finally:
        devcluster.set_mtu("node3", 9000)
    assert devcluster.status().nodes[2].mtu == 9000


@pytest.mark.cluster
def test_drained_node_shows_its_reason_until_resumed(devcluster):
    def scontrol(*args: str) -> None:
        run_checked(["scontrol", *args], timeout=15, env=devcluster.client_env())

    def reasons() -> dict[str, str]:
        out = run_checked(["sinfo", "-R", "-h", "-N", "-o", "%N|%E"], timeout=15,
                          env=devcluster.client_env())
        return parse_sinfo_node_states(out.stdout)

    scontrol("update", "nodename=node3", "state=drain", "reason=trainctl test drain")
    try:
        assert reasons() == {"node3": "trainctl test drain"}
        assert slurm_states(devcluster)["node3"] == "drained"
    finally:
        scontrol("update", "nodename=node3", "state=resume")
    assert reasons() == {}
    devcluster.wait_idle(timeout_s=30)  # `idle*` for a few seconds after a resume


@pytest.mark.cluster
def test_sshd_runs_slurm_commands_and_pins_its_host_key(devcluster):
    endpoint = devcluster.start_sshd("node1")
    client = paramiko.SSHClient()
    client.load_host_keys(endpoint.known_hosts_path)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(endpoint.host, port=endpoint.port, username=endpoint.user,
                   key_filename=endpoint.key_path, look_for_keys=False, allow_agent=False, timeout=15)
    try:
        _, stdout, _ = client.exec_command("hostname; sinfo -h -N -o '%N|%T'", timeout=30)
        output = stdout.read().decode()
        exit_status = stdout.channel.recv_exit_status()
    finally:
        client.close()
    assert exit_status == 0, output
    hostname, *sinfo_lines = output.splitlines()
    assert hostname == "node1"
    assert sorted(parse_sinfo_node_states("\n".join(sinfo_lines))) == ["node1", "node2", "node3", "node4"]

    stranger = paramiko.SSHClient()  # knows no host keys: RejectPolicy must refuse the server
    stranger.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        stranger.connect(endpoint.host, port=endpoint.port, username=endpoint.user,
                         key_filename=endpoint.key_path, look_for_keys=False, allow_agent=False,
                         timeout=15)
    stranger.close()


def teardown_spec() -> ClusterSpec:
    """A second, small cluster beside this session's instance: names, subnet and port of its own
    (derived from the instance, so other checkouts running this test do not collide)."""
    beside = spec_for_instance()
    return ClusterSpec(nodes=2, base_dir=f"{beside.base_dir}-teardown",
                       subnet=f"10.78.{beside.subnet.split('.')[2]}", prefix=f"{beside.prefix}x",
                       slurmctld_port=beside.slurmctld_port + 2, gpus_per_node=2, slurm=beside.slurm)


TEARDOWN_SPEC = teardown_spec()

CRASHING_UP = """
import json, os, sys
from trainctl.devcluster.cluster import ClusterSpec, DevCluster
cluster = DevCluster(ClusterSpec.from_dict(json.loads(sys.argv[1])))
cluster.up()
print(json.dumps(cluster.daemon_pids()), flush=True)
os._exit(3)  # die without down(), like a killed test run
"""


def traces_of(spec: ClusterSpec) -> list[str]:
    """Anything of `spec`'s cluster still on the machine."""
    traces = [f"netns {n}" for n in os.listdir("/run/netns") if n.startswith(f"{spec.prefix}n")] \
        if os.path.isdir("/run/netns") else []
    traces += [f"link {n}" for n in os.listdir("/sys/class/net") if n.startswith(spec.prefix)]
    traces += [f"mount {m}" for m in mounts_under(Path("/proc/self/mountinfo").read_text(),
                                                   spec.base_dir)]
    traces += [device for device in spec.gpu_devices if os.path.lexists(device)]
    traces += [spec.base_dir] if os.path.exists(spec.base_dir) else []
    return traces


@pytest.mark.cluster
def test_up_after_a_crashed_run_then_down_leaves_nothing(devcluster):
    crashed = run([sys.executable, "-c", CRASHING_UP, json.dumps(TEARDOWN_SPEC.to_dict())], timeout=120)
    assert crashed.returncode == 3, crashed.stderr
    crashed_pids = list(json.loads(crashed.stdout).values())
    assert len(crashed_pids) == 4 and all(pid_alive(pid) for pid in crashed_pids)

    cluster = DevCluster(TEARDOWN_SPEC)
    try:
        cluster.up()
        assert not any(pid_alive(pid) for pid in crashed_pids)
        assert slurm_states(cluster) == {"node1": "idle", "node2": "idle"}
        cluster.start_sshd("node2")
        pids = list(cluster.daemon_pids().values())
        assert len(pids) == 5 and all(pids)
    finally:
        cluster.down()

    assert not any(pid_alive(pid) for pid in pids)
    assert traces_of(TEARDOWN_SPEC) == []
    assert cluster.down() == []  # idempotent
    # The session's cluster beside it was not touched.
    assert slurm_states(devcluster) == {f"node{i}": "idle" for i in (1, 2, 3, 4)}
    assert all(pid is not None for pid in devcluster.daemon_pids().values())


@pytest.mark.cluster
def test_a_second_owner_cannot_take_a_cluster_in_use(devcluster):
    with pytest.raises(UsageError, match=f"in use by pid {os.getpid()}"):
        DevCluster(devcluster.spec).down()



def test_extra_slurm_conf_lines_are_appended_checked_and_kept_in_the_state_file():
    spec = ClusterSpec(nodes=1, extra_slurm_conf=("HealthCheckProgram=/opt/hook.sh", "HealthCheckInterval=5"))
    assert slurm_conf_text(spec, "vm").splitlines()[-2:] == list(spec.extra_slurm_conf)
    assert ClusterSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    for bad in ("HealthCheckInterval=5\nProlog=/x", "# a comment", "=5"):
        with pytest.raises(UsageError, match="extra slurm.conf line"):
            ClusterSpec(extra_slurm_conf=(bad,)).validate()


@pytest.mark.parametrize("reason, slurms_own", [
    ("Kill task failed", True),                            # Slurm up to 24.11
    ("Kill task failed (JobId=12 StepId=0)", True),        # Slurm 25.05 and later
    ("Kill task failed by hand", False),
    ("trainctl: Kill task failed", False),
    ("Not responding", False),
])
def test_slurms_unkillable_step_drain_is_recognised_in_every_wording(reason, slurms_own):
    assert faults.is_unkillable_step_reason(reason) is slurms_own


def test_a_step_slurm_cannot_kill_leaves_a_process_record_reported_once(tmp_path):
    # Slurm runs UnkillableStepProgram on the node when a step outlives its kill; the dev
    # cluster's records every process's state and wait channel, and the next cluster test reports it
    from types import SimpleNamespace

    from trainctl.devcluster.faults import new_unkillable_step_records
    from trainctl.devcluster.slurm_daemons import unkillable_step_text

    spec = ClusterSpec(nodes=1, base_dir=str(tmp_path / "dc"))
    assert conf_settings(slurm_conf_text(spec, "vm"))["UnkillableStepProgram"] == f"{tmp_path}/dc/unkillable_step.sh"
    (tmp_path / "dc" / "log").mkdir(parents=True)
    script = tmp_path / "unkillable_step.sh"
    script.write_text(unkillable_step_text(spec))
    subprocess.run(["sh", str(script)], check=True, timeout=30, env={"PATH": os.environ["PATH"], "SLURM_JOB_ID": "42"})
    cluster = SimpleNamespace(spec=spec)
    [record] = new_unkillable_step_records(cluster)
    assert "SLURM_JOB_ID=42" in record and "WCHAN" in record and f" {os.getpid()} " in record
    assert new_unkillable_step_records(cluster) == []


SHEPHERD = """
import os, signal, sys, time
marker = sys.argv[1]
read_end, write_end = os.pipe()
if os.fork() == 0:  # the shepherd: acts when its parent dies (EOF) or on SIGHUP, as srun's does
    os.close(write_end)
    os.setpgid(0, 0)  # a group of its own: orphaned, stopped, it would get SIGHUP and SIGCONT
    signal.signal(signal.SIGHUP, lambda *_: open(marker + ".hup", "w").close())
    while not os.read(read_end, 1):
        open(marker + ".eof", "w").close()
        break
    time.sleep(60)
    os._exit(0)
open(marker + ".ready", "w").close()
time.sleep(60)
"""


@pytest.mark.parametrize("attempt", range(5))
def test_a_killed_node_gives_none_of_its_processes_a_moment_to_act_on_another_death(tmp_path, monkeypatch, attempt):
    # a dead node's processes die together: srun's shepherd must not see srun die, and no
    # process may be woken by SIGHUP/SIGCONT as a stopped, orphaned process group would be
    from types import SimpleNamespace

    marker = tmp_path / "acted"
    parent = subprocess.Popen([sys.executable, "-c", SHEPHERD, str(marker)])
    deadline = time.monotonic() + 30
    while not (tmp_path / "acted.ready").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    child = int(subprocess.run(["pgrep", "-P", str(parent.pid)], capture_output=True, text=True).stdout.split()[0])
    monkeypatch.setattr(faults, "node_pids", lambda cluster, node: [p for p in (parent.pid, child) if faults._alive(p)])
    cluster = SimpleNamespace(spec=ClusterSpec(nodes=1, base_dir=str(tmp_path / "dc")))
    assert faults.kill_node(cluster, "node1") == sorted([parent.pid, child])
    assert parent.wait(timeout=10) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while faults._alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not faults._alive(child)
    assert sorted(p.name for p in tmp_path.glob("acted.*")) == ["acted.ready"]


def test_accounting_adds_slurmdbd_to_slurm_conf_and_a_private_database_config():
    from trainctl.devcluster.accounting import mariadbd_argv, slurmdbd_conf_text

    spec = ClusterSpec(nodes=1, base_dir="/tmp/dc-x", subnet="10.77.5", slurmctld_port=6900, accounting=True)
    assert "AccountingStorageType=accounting_storage/none" in slurm_conf_text(ClusterSpec(nodes=1), "vm")
    conf = slurm_conf_text(spec, "vm")
    for line in ("AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=10.77.5.254",
                 "AccountingStoragePort=6902", "AccountingStoragePass=/tmp/dc-x/run/munge.sock"):
        assert line in conf.splitlines()
    dbd = conf_lines(slurmdbd_conf_text(spec, "vm"))
    assert {"DbdHost=vm", "DbdPort=6902", "StorageType=accounting_storage/mysql", "StorageUser=root",
            "AuthInfo=socket=/tmp/dc-x/run/munge.sock"} <= set(dbd)
    assert not any(line.startswith("StoragePass") for line in dbd)   # the socket's own authentication
    argv = mariadbd_argv(Layout(spec))
    assert "--skip-networking" in argv and "--socket=/tmp/dc-x/run/mariadbd.sock" in argv
    assert argv[argv.index("--exec") + 2:argv.index("--exec") + 4] == ["--", "--no-defaults"]


def test_accounting_refuses_a_slurm_root_whose_slurmctld_is_newer_than_slurmdbd():
    with pytest.raises(UsageError, match="slurmdbd must be at least as new"):
        ClusterSpec(slurm="24.11", accounting=True).validate()
