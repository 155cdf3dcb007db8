"""``opus-testbed keys``: make the CURVE keys that let clients talk to an Opus service bound
where others can reach it (:mod:`controller.curve`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

EPILOG = """\
The directory (default $OPUS_KEYS_DIR, else ~/.opus/keys) gets mode 700 and the secret files
600. It holds the service's pair (server.key, server.key_secret), a client pair (client.key,
client.key_secret) and authorized_clients/, the public keys the service lets in: copy another
client's public client.key there to let it in too. A client needs server.key and its own pair.
Nothing secret is printed: only the public keys' fingerprints.
"""


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "keys", help="make CURVE keys for the Opus service and its clients",
        description="Make the ZeroMQ CURVE key pairs that the Opus service requires whenever "
        "it binds an address outside loopback and the run's own network.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", metavar="DIR", help="where to write them (default "
                   "$OPUS_KEYS_DIR, else ~/.opus/keys)")
    p.add_argument("--force", action="store_true",
                   help="replace existing keys (clients holding the old ones are then refused)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_keys)
    return p


def cmd_keys(args: argparse.Namespace) -> int:
    from controller.curve import KeysError, load_client_keys, load_server_keys, make_keys

    try:
        d = make_keys(args.dir, force=args.force)
        server, client = load_server_keys(d), load_client_keys(d)
    except (KeysError, OSError) as exc:
        print(f"opus-testbed keys: error: {exc}", file=sys.stderr)
        return 1
    info = {"dir": str(d), "server_key": server.pair.fingerprint,
            "client_key": client.pair.fingerprint, "authorized_clients": len(server.authorized)}
    if args.json:
        print(json.dumps(info))
    else:
        print(f"keys written to {d} (mode 700; secret files 600)\n"
              f"  service key {info['server_key']}, client key {info['client_key']} "
              "(authorized)")
    return 0
