"""Site configs: strict loading with precise messages, the search path, `trainctl site`."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainctl.errors import ConfigError, UsageError
from trainctl.site import BUILTIN_SITE_DIR, available_sites, load_site, partition, site_dirs

SAMPLES = sorted(p.stem for p in BUILTIN_SITE_DIR.glob("*.toml"))
DEMO = (BUILTIN_SITE_DIR / "local-demo.toml").read_text()


def test_the_three_samples_are_shipped():
    assert SAMPLES == ["a100-roce", "dgx-h100", "local-demo"]


@pytest.mark.parametrize("name", SAMPLES)
def test_every_sample_loads_and_sets_every_key_with_a_comment(name):
    loaded = load_site(name, dirs=[BUILTIN_SITE_DIR])
    part_name, part = partition(loaded.config, None)
    assert part_name == loaded.config.default_partition
    assert part.socket_ifname
    text = (BUILTIN_SITE_DIR / f"{name}.toml").read_text()
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith("#") and not line.startswith(("name", "description")):
            assert "#" in line.split("=", 1)[1], f"{name}: setting without a why-comment: {line}"


def test_dgx_sample_has_one_hca_per_gpu():
    part = load_site("dgx-h100", dirs=[BUILTIN_SITE_DIR]).config.partitions["h100"]
    assert part.gpus_per_node == len(part.hca_ports) == 8
    assert part.nvlink_type == "NV18" and part.port_rate_gbps == 400.0


def write_site(tmp_path, text, name="bad"):
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def test_unknown_key_names_file_key_path_and_valid_keys_with_defaults(tmp_path):
    path = write_site(tmp_path, DEMO.replace("fabric_iters = 5", "fabric_iterations = 5"))
    with pytest.raises(ConfigError) as err:
        load_site(str(path))
    message = str(err.value)
    assert message.startswith(f"{path}: gate.fabric_iterations: unknown key; valid keys in gate: ")
    assert "fabric_iters (default 5)" in message and "straggler_factor (default 0.7)" in message


def test_wrong_type_names_key_and_expected_type(tmp_path):
    path = write_site(tmp_path, DEMO.replace("gpus_per_node = 1 ", 'gpus_per_node = "one" '))
    with pytest.raises(ConfigError, match=r"partitions\.gpu\.gpus_per_node: expected an integer, "
                                          r"got a string 'one'"):
        load_site(str(path))


def test_boolean_is_not_an_integer(tmp_path):
    path = write_site(tmp_path, DEMO.replace("fabric_iters = 5", "fabric_iters = true"))
    with pytest.raises(ConfigError, match="gate.fabric_iters: expected an integer, got a boolean"):
        load_site(str(path))


def test_missing_required_key(tmp_path):
    text = "\n".join(l for l in DEMO.splitlines() if not l.startswith("socket_ifname"))
    path = write_site(tmp_path, text)
    with pytest.raises(ConfigError, match=r"partitions\.gpu\.socket_ifname: required key is missing"):
        load_site(str(path))


def test_bad_choice_and_bad_toml(tmp_path):
    path = write_site(tmp_path, DEMO.replace('link_layer = "none"', 'link_layer = "infiniband"'))
    with pytest.raises(ConfigError, match="expected one of 'InfiniBand', 'Ethernet', 'none'"):
        load_site(str(path))
    path = write_site(tmp_path, "name = ", name="broken")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_site(str(path))


def test_default_partition_must_exist(tmp_path):
    path = write_site(tmp_path, DEMO.replace('default_partition = "gpu"', 'default_partition = "cpu"'))
    with pytest.raises(ConfigError, match="default_partition = 'cpu' is not among"):
        load_site(str(path))


def test_unknown_site_and_partition(tmp_path):
    with pytest.raises(UsageError, match="unknown site 'nowhere'"):
        load_site("nowhere", dirs=[BUILTIN_SITE_DIR])
    with pytest.raises(UsageError, match="has no partition 'cpu'"):
        partition(load_site("local-demo", dirs=[BUILTIN_SITE_DIR]).config, "cpu")


def test_search_path_later_directory_wins(tmp_path):
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    write_site(env_dir, DEMO.replace("fabric_iters = 5", "fabric_iters = 9"), name="local-demo")
    dirs = site_dirs(environ={"TRAINCTL_SITE_DIR": str(env_dir), "HOME": str(tmp_path)}, cwd=tmp_path)
    assert dirs[0] == BUILTIN_SITE_DIR and dirs[-1] == env_dir
    assert available_sites(dirs)["local-demo"] == env_dir / "local-demo.toml"
    assert load_site("local-demo", dirs=dirs).config.gate.fabric_iters == 9


def test_provenance_tells_file_from_default(tmp_path):
    text = "\n".join(l for l in DEMO.splitlines() if not l.startswith("qos"))
    loaded = load_site(str(write_site(tmp_path, text)))
    assert loaded.source_of("slurm.qos") == "default"
    assert loaded.source_of("slurm.account") == str(tmp_path / "bad.toml")
    dgx = load_site("dgx-h100", dirs=[BUILTIN_SITE_DIR])
    assert dgx.source_of("probes") == str(BUILTIN_SITE_DIR / "dgx-h100.toml")
    assert load_site("local-demo", dirs=[BUILTIN_SITE_DIR]).source_of("probes") == "default"


def run_cli(*args, cwd=None):
    exe = Path(sys.executable).with_name("trainctl")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_cli_show_json_and_bad_file_exit_2(tmp_path):
    out = run_cli("site", "show", "local-demo", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert shown["partitions.gpu.socket_ifname"]["value"] == "eth0"
    bad = write_site(tmp_path, DEMO.replace("fabric_iters = 5", "fabric_iterations = 5"))
    out = run_cli("site", "show", str(bad))
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1
    assert "gate.fabric_iterations: unknown key" in out.stderr


def test_cli_list(tmp_path):
    out = run_cli("site", "list", "--json", cwd=tmp_path)
    assert out.returncode == 0
    assert set(json.loads(out.stdout)) >= set(SAMPLES)


@pytest.mark.parametrize("name", ["1X", "A-B", "A B", "X=Y", ""])
def test_launch_env_names_must_be_environment_variable_names(tmp_path, name):
    path = write_site(tmp_path, DEMO.replace('[launch]\n', f'[launch.env]\n"{name}" = "1"\n\n[launch]\n'))
    with pytest.raises(ConfigError, match=f"launch.env.{name}: not an environment variable name"):
        load_site(str(path))


def test_site_show_lists_each_launch_env_variable_with_its_source(tmp_path):
    path = write_site(tmp_path, DEMO.replace('[launch]\n', '[launch.env]\nNCCL_IB_TC = "106"\nUCX_TLS = "rc,sm"\n\n'
                                                          '[launch]\n'), name="env")
    out = run_cli("site", "show", str(path), "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert shown["launch.env.NCCL_IB_TC"] == {"value": "106", "source": str(path)}
    assert shown["launch.env.UCX_TLS"] == {"value": "rc,sm", "source": str(path)}
    text = run_cli("site", "show", str(path), cwd=tmp_path).stdout
    assert any(line.startswith("launch.env.NCCL_IB_TC") and line.endswith('= "106"    # file')
               for line in text.splitlines())


def test_gate_unknown_policy_defaults_to_exclude_and_takes_keep_only_by_name(tmp_path):
    assert load_site("local-demo", dirs=[BUILTIN_SITE_DIR]).config.gate.unknown == "exclude"
    keep = write_site(tmp_path, DEMO.replace("[gate]\n", '[gate]\nunknown = "keep"\n'), "keep")
    assert load_site(str(keep)).config.gate.unknown == "keep"
    maybe = write_site(tmp_path, DEMO.replace("[gate]\n", '[gate]\nunknown = "ignore"\n'), "maybe")
    with pytest.raises(ConfigError, match="gate.unknown: expected one of 'exclude', 'keep'"):
        load_site(str(maybe))


def test_watch_section_takes_the_demo_values_and_the_models_defaults_elsewhere():
    demo = load_site("local-demo", dirs=[BUILTIN_SITE_DIR]).config.watch
    assert (demo.check_interval_s, demo.checks) == (10.0, ("gpu.xid",))
    dgx = load_site("dgx-h100", dirs=[BUILTIN_SITE_DIR]).config.watch
    assert dgx.enabled and dgx.check_interval_s == 30.0 and dgx.agent_write_s == 1.0
    assert "gpu.xid" in dgx.checks and "ib.counters" in dgx.checks


def test_an_unknown_check_in_the_sites_watch_is_refused_like_the_gates(tmp_path):
    bad = write_site(tmp_path, DEMO.replace('checks = ["gpu.xid"]', 'checks = ["gpu.xid", "gpu.xdi"]'))
    out = run_cli("site", "show", str(bad))
    assert out.returncode == 2, out.stderr
    assert "watch.checks: unknown check(s) 'gpu.xdi'" in out.stderr


@pytest.mark.parametrize("key, value", [("check_interval_s", "0"), ("agent_write_s", "0.01")])
def test_watch_intervals_are_bounded(tmp_path, key, value):
    bad = write_site(tmp_path, re.sub(rf"^{key} = [^ ]*", f"{key} = {value}", DEMO, count=1, flags=re.M))
    assert f"{key} = {value} " in bad.read_text()
    with pytest.raises(ConfigError, match=f"watch.{key}"):
        load_site(str(bad))
