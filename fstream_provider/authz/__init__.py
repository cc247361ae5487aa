"""Authorization's room (issue 40): who may ask for what, and who said so.

- ``signing``: submitters' Ed25519 job signatures (``fstream-job-v2``), the local submitter's pair;
- ``outcome``: agents' Ed25519 signatures over job outcomes, and the trust clients verify them against;
- ``policy``: the agent's policy file (roots, destinations, keys by id, submitters' public keys);
- ``ed25519``: the key files and key ids both kinds of signature share.

The enforcement sits with who enforces: the agent's decisions in ``transfer_agent.daemon.authorize``, roots as
filesystem boundaries in ``transfer_agent.storage.contain``, the Redis ACL users in ``fstream_provider.bus.acl``,
receiver keys and quotas in ``transfer_agent.receiving``. The contract (``.importlinter``, "authz-room"): no other
room of the provider or the agent imports ``cryptography``; signatures are made and checked here only (the
agent's wire TLS, ``transfer_agent.wire``, is the one other user of it). docs/security.md is the threat model.
"""
