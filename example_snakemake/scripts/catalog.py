"""Rule ``catalog``: the TSV catalog (path, size, algo, checksum) of the files an ``fstream send --manifest`` landed."""

# no `from __future__ import annotations`: Snakemake puts its preamble before this file's first line
import json

LANDED = {"committed", "skipped"}  # skipped: the receiver already held the same bytes


def catalog(manifest: str, summary: str, out: str) -> None:
    """Write ``out`` from ``manifest`` (JSON Lines).

    :raises ValueError: the manifest is empty, lists a file not landed, or not every file ``summary`` counts.
    """
    with open(manifest) as f:
        records = [json.loads(line) for line in f if line.strip()]
    if not records:
        raise ValueError(f"{manifest}: empty, no file landed")
    bad = [r for r in records if r.get("status") not in LANDED]
    if bad:
        raise ValueError(f"{manifest}: {len(bad)} file(s) not landed, e.g. {bad[0]}")
    with open(summary) as f:
        sent = json.load(f)["files"]
    if sent != len(records):
        raise ValueError(f"{manifest}: {len(records)} records for {sent} files sent")
    with open(out, "w") as f:
        f.write("path\tsize\talgo\tchecksum\n")
        for r in sorted(records, key=lambda r: r["path"]):
            f.write(f"{r['path']}\t{r['size']}\t{r['algo']}\t{r['checksum']}\n")


def main(smk) -> None:
    try:
        catalog(smk.input.manifest, smk.input.summary, smk.output[0])
    except ValueError as e:
        with open(smk.log[0], "w") as f:
            print(e, file=f)
        raise SystemExit(f"catalog: {e}") from None


if "snakemake" in globals():  # Snakemake runs this file with a `snakemake` object defined
    main(snakemake)  # noqa: F821
