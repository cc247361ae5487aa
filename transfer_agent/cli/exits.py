"""The exit codes of ``fstream`` commands, one set for all (``fstream send --help`` lists them).

A workflow engine decides from them whether to retry a step: Nextflow
``errorStrategy { task.exitStatus == 75 ? 'retry' : 'terminate' }``, Snakemake ``retries:``.
"""

from __future__ import annotations

from transfer_agent.sending.result import TransferResult

EXIT_OK = 0  # every file landed (or was already there)
EXIT_FAILED = 1  # a file failed and another try will not help without a change (permissions, source changed, ...)
EXIT_USAGE = 2  # a bad option, spec or configuration (argparse uses 2 as well)
EXIT_RETRY = 75  # retryable (EX_TEMPFAIL): receiver unreachable, network, stall; a rerun resends only what is missing
EXIT_INTERRUPTED = 130  # stopped by SIGINT/SIGTERM; a rerun resumes


def exit_code(result: TransferResult) -> int:
    """The documented exit code of ``fstream send`` for ``result`` (docs/pipelines.md, "Exit codes")."""
    if result.ok:
        return EXIT_OK
    if result.cancelled:
        return EXIT_INTERRUPTED
    return EXIT_RETRY if result.retryable else EXIT_FAILED
