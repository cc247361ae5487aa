"""Metrics and health attached to a running ``fstream receive`` or ``fstream agent``, and their ``--check``
(issue 30, "Prometheus metrics" and "Health").

``ReceiverService(args)`` / ``AgentService(args)`` read the service options when the command starts (a bad
value is an error naming the option, before anything runs); ``check`` runs the readiness checks once and
prints them (exit 0 when all pass, else 1); ``start`` serves ``/metrics``, ``/healthz`` and ``/readyz`` for the
running daemon when ``--metrics-listen`` was given (nothing, and no ``prometheus_client`` import, without it),
printing the bound address; ``stop`` ends the server.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from transfer_agent.service.health import Check, agent_readiness, receiver_readiness, report
from transfer_agent.service.options import parse_listen


def print_checks(checks: list[Check], out: Any = None) -> int:
    """Print the checks (``ready``/``not ready``, then one line each); 0 when all passed, else 1."""
    ready, text = report(checks)
    print(text, end="", file=out or sys.stdout, flush=True)
    return 0 if ready else 1


class _Service:
    command = ""

    def __init__(self, args: argparse.Namespace) -> None:
        self.listen = parse_listen(args.metrics_listen) if args.metrics_listen else None
        self.endpoint: Any = None  # endpoint.ServiceEndpoint once started
        self.metrics: Any = None

    def _serve(self, registry: Any, readiness: Any) -> None:
        from transfer_agent.service.endpoint import ServiceEndpoint

        self.endpoint = ServiceEndpoint(self.listen, registry, readiness).start()
        print(f"fstream {self.command}: metrics on {self.endpoint.url}/metrics (health: /healthz, /readyz)",
              file=sys.stderr, flush=True)

    def stop(self) -> None:
        if self.endpoint is not None:
            self.endpoint.stop()
            self.endpoint = None
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None


class ReceiverService(_Service):
    """The receiver's service options: ``--metrics-listen``, ``--free-space-floor``, ``--check``."""

    command = "receive"

    def __init__(self, args: argparse.Namespace) -> None:
        from fstream_provider.model.units import parse_size

        super().__init__(args)
        try:
            self.floor = parse_size(args.free_space_floor)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"--free-space-floor {args.free_space_floor!r}: {exc}") from None
        self.roots = [os.path.abspath(args.root)]

    def check(self) -> int:
        return print_checks(receiver_readiness(self.roots, self.floor)())

    def start(self, receiver: Any) -> None:
        if self.listen is None:
            return
        from transfer_agent.service.metrics import ReceiverMetrics

        self.metrics = ReceiverMetrics(receiver, self.roots)
        self._serve(self.metrics.registry,
                    receiver_readiness(self.roots, self.floor, getattr(receiver, "draining", None)))


class AgentService(_Service):
    """The agent's service options: ``--metrics-listen``, ``--check``."""

    command = "agent"

    @staticmethod
    def check(url: str, keys: Any, policy: Any) -> int:
        """``--check`` (a unit's ``ExecStartPre``): before the agent runs, so a bus with no jobs stream or group yet
        passes (the agent creates them when it starts: the first start, or Redis lost its data)."""
        return print_checks(agent_readiness(url, keys, list(policy.roots.roots), first_start=True)())

    def start(self, agent: Any, url: str, keys: Any) -> None:
        if self.listen is None:
            return
        from transfer_agent.service.metrics import AgentMetrics
        from transfer_agent.service.queue_depth import QueueDepth

        self.metrics = AgentMetrics(agent, QueueDepth(url, keys))
        agent.observer = self.metrics
        self._serve(self.metrics.registry, agent_readiness(url, keys, list(agent.policy.roots.roots)))
