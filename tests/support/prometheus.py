"""A real node_exporter and a real Prometheus on 127.0.0.1, for a test that scrapes a job's metrics
as a site would (Debian's `prometheus-node-exporter` and `prometheus`, which scripts/setup installs).

node_exporter runs its textfile collector only (every other collector off), reading the folder
the test names as the site's `[metrics] textfile_dir`; Prometheus scrapes it every second and
keeps its samples in a temporary folder of its own. Both listen on free loopback ports, log into
the test's folder, and are stopped (then killed) with hard timeouts. Queries go through
Prometheus's HTTP API (https://prometheus.io/docs/prometheus/latest/querying/api/) with urllib.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

NODE_EXPORTER = "prometheus-node-exporter"     # Debian's name for node_exporter
PROMETHEUS = "prometheus"
PROMTOOL = "promtool"                           # beside it, in Debian's `prometheus`
SCRAPE_S = 1
START_S = 60                    # each daemon's start, bounded
STOP_S = 15
QUERY_TIMEOUT_S = 10


@dataclass(frozen=True)
class Prometheus:
    url: str
    textfile_dir: Path          # the folder node_exporter's textfile collector reads

    def _get(self, endpoint: str, params: dict[str, str]) -> dict:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{endpoint}?{query}", timeout=QUERY_TIMEOUT_S) as answer:
            body = json.loads(answer.read(8 << 20))
        assert body.get("status") == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query now: [{"metric": {...}, "value": [t, "v"]}, ...]."""
        return self._get("query", {"query": expr})["result"]

    def query_range(self, expr: str, start: float, end: float, step_s: float = SCRAPE_S) -> list[dict]:
        """A range query: [{"metric": {...}, "values": [[t, "v"], ...]}, ...]."""
        return self._get("query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                         "step": f"{step_s:g}"})["result"]

    def wait_for_series(self, expr: str, timeout_s: float) -> list[dict]:
        """The query's result once it has one, within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(expr)
            if result:
                return result
            assert time.monotonic() < deadline, f"no series for {expr} in Prometheus within {timeout_s} s"
            time.sleep(0.5)


def lint(text: str) -> str:
    """What Prometheus's own linter (`promtool check metrics`: the text format and the naming
    conventions) says of a metrics file; empty where it finds nothing."""
    checked = subprocess.run([shutil.which(PROMTOOL), "check", "metrics"], input=text, capture_output=True, text=True,
                             timeout=QUERY_TIMEOUT_S)
    return "" if checked.returncode == 0 else (checked.stdout + checked.stderr).strip()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _ready(url: str, process: subprocess.Popen, log: Path) -> None:
    """Wait, bounded, until `url` answers 200; the daemon's log where it exits or never does."""
    deadline = time.monotonic() + START_S
    while True:
        assert process.poll() is None, f"{process.args[0]} exited {process.returncode}: {log.read_text()[-2000:]}"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        assert time.monotonic() < deadline, f"{url} not ready within {START_S} s: {log.read_text()[-2000:]}"
        time.sleep(0.2)


@contextlib.contextmanager
def _daemon(argv: list[str], log: Path, ready_url: str) -> Iterator[None]:
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    try:
        _ready(ready_url, process, log)
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_S)


@contextlib.contextmanager
def scraped_textfiles(folder: Path) -> Iterator[Prometheus]:
    """node_exporter reading `folder/textfile/` (made where missing), Prometheus scraping it every
    second, both ready."""
    textfile_dir = folder / "textfile"
    textfile_dir.mkdir(parents=True, exist_ok=True)     # a test may make it first, for the job's site
    exporter_port, prometheus_port = free_port(), free_port()
    config = folder / "prometheus.yml"
    config.write_text(json.dumps({    # YAML reads JSON
        "global": {"scrape_interval": f"{SCRAPE_S}s", "scrape_timeout": f"{SCRAPE_S}s"},
        "scrape_configs": [{"job_name": "node", "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]}],
    }))
    exporter = [shutil.which(NODE_EXPORTER), "--collector.disable-defaults", "--collector.textfile",
                f"--collector.textfile.directory={textfile_dir}", f"--web.listen-address=127.0.0.1:{exporter_port}"]
    server = [shutil.which(PROMETHEUS), f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
              f"--web.listen-address=127.0.0.1:{prometheus_port}"]
    url = f"http://127.0.0.1:{prometheus_port}"
    with _daemon(exporter, folder / "node-exporter.log", f"http://127.0.0.1:{exporter_port}/metrics"), \
            _daemon(server, folder / "prometheus.log", f"{url}/-/ready"):
        yield Prometheus(url, textfile_dir)
