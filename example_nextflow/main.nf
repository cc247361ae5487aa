#!/usr/bin/env nextflow
/*
 * Ship an instrument's files through FStream in batches, then catalog what landed.
 *
 *   nextflow run example_nextflow --src /data/run42 \
 *       --to fstream://archive:9000/runs/run42 --secret_file /etc/fstream/secret
 *
 * With --watch true the directory is watched (new and modified files) until a file
 * named params.done (DONE) appears in it. Each batch of params.batch files is one
 * `fstream send`; its manifest (one JSON line per landed file) feeds CATALOG.
 *
 * SHIP's exit status is fstream's: 0 every file landed; 75 retryable (receiver
 * unreachable, network, stall: a rerun re-sends only what is missing); 1 a file failed
 * and a rerun will not help; 2 usage or configuration; 130 interrupted. Only 75 is retried.
 *
 * Untested against Nextflow itself: see README.md.
 */

process SHIP {
    errorStrategy { task.exitStatus == 75 ? 'retry' : 'terminate' }
    maxRetries params.retries

    input:
    path files

    output:
    path 'manifest.jsonl', emit: manifest
    path 'summary.json', emit: summary

    script:
    """
    echo "SHIP attempt ${task.attempt}: ${files}" >&2
    fstream send ${files} --to ${params.to} --secret-file ${params.secret_file} \\
        --json --manifest manifest.jsonl > summary.json
    """
}

process CATALOG {
    input:
    path manifest

    output:
    path 'catalog.tsv', emit: catalog

    script:
    """
    catalog_manifest.py ${manifest} > catalog.tsv
    """
}

workflow {
    if (!params.src || !params.to || !params.secret_file) {
        error "give --src DIR --to fstream://HOST:PORT/DEST/PATH --secret_file FILE"
    }

    def files = params.watch ?
        channel.watchPath(params.src + '/' + params.pattern, 'create,modify')
            .until { f -> f.name == params.done } :
        channel.fromPath(params.src + '/' + params.pattern)

    // a file written in several steps is reported more than once: send it once per batch
    def batches = files
        .buffer(size: params.batch, remainder: true)
        .map { batch -> batch.unique() }

    SHIP(batches)
    CATALOG(SHIP.out.manifest)

    SHIP.out.manifest.collectFile(name: 'manifest.jsonl', storeDir: params.outdir)
    CATALOG.out.catalog.collectFile(name: 'catalog.tsv', storeDir: params.outdir, keepHeader: true, skip: 1)
}
