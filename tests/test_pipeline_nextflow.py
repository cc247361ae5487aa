r"""example_nextflow/main.nf's script blocks, rendered and run with bash as Nextflow would, against a real receiver.

Nextflow cannot be installed on the CI machine, so this test plays its part for the two
processes: it parses each ``process NAME { ... }`` of main.nf, renders its ``script:`` block
the way Nextflow renders a GString, stages the inputs into a task directory as symlinks and
runs ``bash -ue .command.sh`` there, then checks the declared ``path`` outputs exist.

Substitution map (what Nextflow would put in for each variable a script block uses):

==================  ===================================================================
``${params.NAME}``  the run's parameter (``--NAME value``): the ``params`` a test passes
``${files}``        a ``path`` input: the staged file names, space-separated (a single
                    file: its name); every ``path NAME`` input is handled the same way
``${task.attempt}`` 1 on the first try, then 2, 3, ... on each retry
``${task.index}``   the task's index within its process, from 1
``${task.process}`` the process name
``$name``           the same as ``${name}`` (Groovy's short form, dotted paths included)
``\$``, ``\\``      Groovy escapes: a literal ``$``, a literal ``\`` (so ``\\`` at a line end
                    is bash's line continuation)
==================  ===================================================================

Any other variable or escape fails the test instead of being passed to bash unrendered.
The ``bin/`` directory of the pipeline is on PATH, as Nextflow puts it there for every task.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import xxhash
from agentkit import make_files

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "example_nextflow"
DEST = "runs/run42"
SIZES = {"run.json": 300, "f000.raw": 700_000, "f001.raw": 1_300_000, "f002.raw": 65_536, "empty.flag": 0}
BATCH = 2  # params.batch: 5 files make 3 SHIP tasks, as buffer(size: 2, remainder: true) emits them


@dataclass
class Process:
    """One ``process NAME { ... }`` of main.nf.

    :param name: the process name.
    :param body: the text between ``process NAME {`` and the next top-level definition.
    :param inputs: names of its ``path NAME`` inputs.
    :param outputs: file names of its ``path 'NAME'`` outputs.
    :param script: the ``script:`` block between its triple quotes, as written (not rendered).
    """

    name: str
    body: str
    inputs: list[str]
    outputs: list[str]
    script: str


def section(body: str, name: str) -> str:
    """The lines of a process's ``name:`` section (up to the next ``word:`` label)."""
    m = re.search(rf"^\s*{name}:\s*$(.*?)(?=^\s*\w+:\s*$|\Z)", body, re.M | re.S)
    return m.group(1) if m else ""


def parse_processes(text: str) -> dict[str, Process]:
    """Every process of a Nextflow script, by name."""
    procs: dict[str, Process] = {}
    heads = list(re.finditer(r"^process\s+(\w+)\s*\{", text, re.M))
    for m in heads:
        nxt = re.compile(r"^(?:process|workflow)\b", re.M).search(text, m.end())
        body = text[m.end():nxt.start() if nxt else len(text)]
        script = re.search(r'^\s*script:\s*\n\s*"""(.*?)"""', body, re.M | re.S)
        assert script, f"process {m.group(1)}: no script: block with a triple-quoted string"
        procs[m.group(1)] = Process(
            name=m.group(1),
            body=body,
            inputs=re.findall(r"^\s*path\s+(\w+)\s*$", section(body, "input"), re.M),
            outputs=re.findall(r"^\s*path\s+'([^']+)'", section(body, "output"), re.M),
            script=script.group(1),
        )
    return procs


PROCESSES = parse_processes((EXAMPLE / "main.nf").read_text())


def render(script: str, variables: dict[str, str]) -> str:
    """Render a script block as Nextflow renders a GString (see the module docstring); unknown names fail."""

    def one(m: re.Match[str]) -> str:
        if m.group("esc") is not None:
            assert m.group("esc") in "$\\", f"Groovy escape \\{m.group('esc')} is not emulated by this test"
            return m.group("esc")
        name = m.group("braced") or m.group("bare")
        assert name in variables, f"${{{name}}} has no value in the test's substitution map"
        return variables[name]

    pattern = r"\\(?P<esc>.)|\$\{(?P<braced>[^}]*)\}|\$(?P<bare>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)"
    return re.sub(pattern, one, textwrap.dedent(script).strip("\n") + "\n", flags=re.S)


def run_task(proc: Process, work: Path, index: int, inputs: dict[str, list[Path]], params: dict[str, object],
             attempt: int = 1) -> tuple[int, Path]:
    """Stage ``inputs``, render ``proc``'s script, run it as Nextflow's local executor would; (exit status, task)."""
    task = work / f"{proc.name}-{index}"
    task.mkdir(parents=True)
    assert sorted(inputs) == sorted(proc.inputs), f"{proc.name} declares path inputs {proc.inputs}"
    variables = {f"params.{k}": str(v) for k, v in params.items()}
    variables.update({"task.attempt": str(attempt), "task.index": str(index), "task.process": proc.name})
    for name, paths in inputs.items():
        for p in paths:
            (task / p.name).symlink_to(os.path.abspath(p))  # stageInMode 'symlink', Nextflow's default
        variables[name] = " ".join(p.name for p in paths)
    (task / ".command.sh").write_text("#!/bin/bash -ue\n" + render(proc.script, variables))
    env = dict(os.environ, FSTREAM_STATE_DIR=str(work / "state"))
    env["PATH"] = os.pathsep.join([str(EXAMPLE / "bin"), str(Path(sys.executable).parent), env.get("PATH", "")])
    with open(task / ".command.out", "wb") as out, open(task / ".command.err", "wb") as err:
        rc = subprocess.run(["bash", "-ue", ".command.sh"], cwd=task, env=env, stdout=out, stderr=err,
                            timeout=60).returncode
    if rc == 0:
        missing = [o for o in proc.outputs if not (task / o).exists()]
        assert not missing, f"{proc.name}: missing output file(s) {missing}"
    return rc, task


def test_parser_finds_both_processes_and_their_wiring() -> None:
    assert {"SHIP", "CATALOG"} <= set(PROCESSES), f"processes found in main.nf: {sorted(PROCESSES)}"
    ship, catalog = PROCESSES["SHIP"], PROCESSES["CATALOG"]
    assert (ship.inputs, ship.outputs) == (["files"], ["manifest.jsonl", "summary.json"])
    assert (catalog.inputs, catalog.outputs) == (["manifest"], ["catalog.tsv"])
    assert "fstream send ${files}" in ship.script and "--manifest manifest.jsonl" in ship.script
    # the chaining the next test plays out is the one main.nf declares
    workflow = (EXAMPLE / "main.nf").read_text().split("\nworkflow {", 1)[1]
    assert "CATALOG(SHIP.out.manifest)" in workflow
    assert ".buffer(size: params.batch, remainder: true)" in workflow


def test_script_blocks_ship_batches_and_catalog_their_manifests(tmp_path: Path, rx, secret: Path) -> None:
    src = make_files(tmp_path / "instrument", SIZES)
    params = {"to": f"fstream://127.0.0.1:{rx.port}/{DEST}", "secret_file": secret, "batch": BATCH}
    listed = sorted(p for p in src.iterdir() if p.is_file())  # channel.fromPath(params.src + '/*')
    batches = [listed[i:i + BATCH] for i in range(0, len(listed), BATCH)]

    records, rows = [], []
    for index, batch in enumerate(batches, 1):
        rc, ship = run_task(PROCESSES["SHIP"], tmp_path / "work", index, {"files": batch}, params)
        assert rc == 0, (ship / ".command.err").read_text()[-4000:]
        assert f"SHIP attempt 1: {' '.join(p.name for p in batch)}" in (ship / ".command.err").read_text()
        shipped = [json.loads(line) for line in (ship / "manifest.jsonl").read_text().splitlines() if line.strip()]
        assert sorted(r["path"] for r in shipped) == sorted(f"{DEST}/{p.name}" for p in batch)
        assert json.loads((ship / "summary.json").read_text())["failed_files"] == 0

        rc, cat = run_task(PROCESSES["CATALOG"], tmp_path / "work", index, {"manifest": [ship / "manifest.jsonl"]},
                           params)
        assert rc == 0, (cat / ".command.err").read_text()
        lines = [line.split("\t") for line in (cat / "catalog.tsv").read_text().splitlines()]
        assert lines[0] == ["path", "size", "algo", "checksum"]
        records += shipped
        rows += lines[1:]

    by_path = {r["path"]: r for r in records}
    assert len(by_path) == len(records) == len(SIZES), sorted(r["path"] for r in records)
    for name, size in SIZES.items():
        data = (src / name).read_bytes()
        assert (tmp_path / "dst" / DEST / name).read_bytes() == data, f"{name} landed with other bytes"
        rec = by_path[f"{DEST}/{name}"]
        assert (rec["status"], rec["size"], rec["algo"]) == ("committed", size, "xxh3_128"), rec
        assert rec["checksum"] == xxhash.xxh3_128_hexdigest(data), rec
    assert sorted(rows) == sorted([p, str(r["size"]), r["algo"], r["checksum"]] for p, r in by_path.items())


@pytest.mark.slow
def test_ship_exits_with_the_status_its_error_strategy_retries(tmp_path: Path, secret: Path) -> None:
    strategy = re.search(r"errorStrategy\s*\{\s*task\.exitStatus\s*==\s*(\d+)\s*\?\s*'retry'\s*:\s*'terminate'\s*\}",
                         PROCESSES["SHIP"].body)
    assert strategy, "SHIP's errorStrategy no longer retries one exit status and terminates on the others"
    src = make_files(tmp_path / "instrument", {"a.raw": 1000})
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    # fstream reconnects for about 17 s before it gives up
    rc, ship = run_task(PROCESSES["SHIP"], tmp_path / "work", 1, {"files": [src / "a.raw"]},
                        {"to": f"fstream://127.0.0.1:{port}/{DEST}", "secret_file": secret})

    assert rc == int(strategy.group(1)) == 75, (ship / ".command.err").read_text()[-4000:]
    assert "Connection refused" in (ship / ".command.err").read_text()


def test_catalog_script_refuses_an_empty_or_unlanded_manifest(tmp_path: Path) -> None:
    empty = tmp_path / "empty" / "manifest.jsonl"
    empty.parent.mkdir()
    empty.write_text("")
    failed = tmp_path / "failed" / "manifest.jsonl"
    failed.parent.mkdir()
    failed.write_text(json.dumps({"path": f"{DEST}/a.raw", "size": 1, "algo": "xxh3_128", "checksum": "00",
                                  "status": "failed"}) + "\n")

    for index, (manifest, says) in enumerate([(empty, "empty, no file landed"), (failed, "1 file(s) not landed")], 1):
        rc, cat = run_task(PROCESSES["CATALOG"], tmp_path / "work", index, {"manifest": [manifest]}, {})
        assert rc == 1 and says in (cat / ".command.err").read_text(), (cat / ".command.err").read_text()
