"""Smoke test of bench/gate_decide_scale.py: its generator and the real `gate decide` at 64 nodes
(the bench runs 4,096 by hand). The node reports are the recorded H100 snapshot judged by
`trainctl health check`; the fabric report comes from health/fabric/report.py."""

import importlib.util
import json
from pathlib import Path

from trainctl.slurm import fold_hostlist

BENCH = Path(__file__).resolve().parents[1] / "bench" / "gate_decide_scale.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("gate_decide_scale", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_decide_over_generated_reports_names_every_planted_fault_folded(tmp_path):
    bench = load_bench()
    planted = bench.make_gate_dir(tmp_path / "gate", 64, compute=False)
    assert planted["failing"] == {"gpu0008", "gpu0058"} and planted["silent"] == {"gpu0004"}
    assert planted["slow"] == {"gpu0022"}
    bench.stub_scontrol(tmp_path / "bin")
    hostlist = fold_hostlist(planted["hosts"])

    failed = bench.run_decide(tmp_path / "gate", hostlist, 64, tmp_path / "bin")
    assert failed["rc"] == 2
    line = failed["stderr"].strip().splitlines()[-1]
    assert len(line) <= 300
    assert line.startswith("trainctl: error: only 60 of 64 nodes healthy, need 64: gpu0004 no health report")
    # the failing nodes' causes, folded once for both nodes; the site declares HCA ports and the
    # recorded VM has no InfiniBand device, so the ib checks fail there too
    assert "; gpu[0008,0058] gpu.count, host.cpus, ib.counters, ib.mtu, ib.netdev, ib.ports, nvlink.links, " in line
    assert line.endswith("; gpu0022 fabric: straggler")
    decision = json.loads((tmp_path / "gate" / "decision.json").read_text())
    assert {e["host"] for e in decision["excluded"]} == planted["failing"] | planted["silent"] | planted["slow"]
    assert any(r.startswith("fabric: straggler") for e in decision["excluded"] if e["host"] == "gpu0022"
               for r in e["reasons"])

    chosen = bench.run_decide(tmp_path / "gate", hostlist, 60, tmp_path / "bin")
    assert chosen["rc"] == 0, chosen["stderr"]
    assert chosen["stdout"].splitlines() == [fold_hostlist(planted["healthy"]), "gpu0001"]
    # what the job's supervisor reads: the same nodes and address, in decision.json
    decision = json.loads((tmp_path / "gate" / "decision.json").read_text())
    assert (fold_hostlist(decision["chosen"]), decision["master_addr"]) == (fold_hostlist(planted["healthy"]), "gpu0001")
