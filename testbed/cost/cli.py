"""``opus-testbed cost``: electrical against photonic rails, in dollars and watts.

The CLI calls :func:`register` on its sub-parsers; the handler :func:`run` returns the exit code
(2 for a bad parts file or cluster, with the file, position and key in the message).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from testbed.cost.model import (
    DEFAULT_GPUS_PER_SERVER,
    DEFAULT_NIC_PORTS,
    ClusterSpec,
    Comparison,
    CostModelError,
    Fabric,
    compare,
    load_parts,
    max_servers_per_ocs,
    table3,
)

DESCRIPTION = """\
Bill of materials and totals of a cluster's rail fabric built from electrical packet switches
(transceivers at the switch end of every link, multi-tier Clos when a rail outgrows one switch)
against the same rails built from one optical circuit switch each, after the paper's Fig. 7;
then Table 3's GPU counts per OCS technology. The transceiver in each GPU's NIC, the same in
both fabrics, is a server part unless --nic-optics count puts it in both bills.
Parts (price, power, source) come from an editable YAML file."""


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``cost`` sub-command to ``subparsers`` (from ``add_subparsers``)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "cost", help="cost and power: electrical rails vs photonic rails (Fig. 7, Table 3)",
        description=DESCRIPTION)
    p.add_argument("--parts", metavar="FILE",
                   help="parts YAML (default: the shipped testbed/cost/parts.yaml)")
    p.add_argument("--servers", type=int, metavar="N",
                   help="servers in the cluster (default: as many as one OCS per rail serves, "
                        f"OCS ports / {DEFAULT_NIC_PORTS})")
    p.add_argument("--gpus-per-server", type=int, metavar="G", default=DEFAULT_GPUS_PER_SERVER,
                   help=f"GPUs per server = rails (default: {DEFAULT_GPUS_PER_SERVER}, DGX H200)")
    p.add_argument("--nic-optics", choices=("exclude", "count"), default="exclude",
                   help="the transceiver in each GPU's NIC: a server part left out of both "
                        "bills (default; the paper's 95.84 %% power saving implies it), or "
                        "counted in both")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Handle ``opus-testbed cost``; returns the exit code."""
    out = out or sys.stdout
    try:
        parts = load_parts(args.parts)
        for option, value in (("--servers", args.servers),
                              ("--gpus-per-server", args.gpus_per_server)):
            if value is not None and value < 1:
                raise CostModelError(f"{option} must be >= 1, got {value}")
        servers = args.servers if args.servers is not None else max_servers_per_ocs(parts)
        result = compare(parts, ClusterSpec(servers, args.gpus_per_server),
                         count_nic_transceivers=args.nic_optics == "count")
    except CostModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = table3(args.gpus_per_server, result.cluster.nic_ports)
    if args.json:
        json.dump({**result.to_json(), "table3": rows}, out, indent=1)
        out.write("\n")
    else:
        print_report(result, rows, out)
    return 0


def _money(value: float) -> str:
    return f"{value:,.0f}"


def _watts(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.2f}"


def _print_fabric(title: str, fabric: Fabric, out: TextIO) -> None:
    print(f"{title}: {fabric.description}", file=out)
    print(f"  {'item':<28} {'qty':>6} {'unit USD':>10} {'total USD':>12} {'unit W':>8} "
          f"{'total W':>10}", file=out)
    for line in fabric.lines:
        print(f"  {line.item:<28} {line.quantity:>6} {_money(line.part.price_usd):>10} "
              f"{_money(line.price_usd):>12} {_watts(line.part.power_w):>8} "
              f"{_watts(line.power_w):>10}", file=out)
    print(f"  {'total':<28} {'':>6} {'':>10} {_money(fabric.price_usd):>12} {'':>8} "
          f"{_watts(fabric.power_w):>10}", file=out)


def print_report(result: Comparison, rows: list[dict[str, Any]], out: TextIO) -> None:
    """The human-readable table."""
    c = result.cluster
    print(f"cluster: {c.servers} servers x {c.gpus_per_server} GPUs = {c.gpus} GPUs, "
          f"{c.gpus_per_server} rails, {c.nic_ports} NIC ports per GPU", file=out)
    optics = "counted in both bills" if result.nic_transceivers_counted else "server parts"
    print(f"NIC transceivers: {optics}", file=out)
    print(f"parts:   {result.parts.path}", file=out)
    for part in (result.parts.packet_switch, result.parts.transceiver, result.parts.ocs):
        print(f"  {part.key}: {part.name}", file=out)
    print(file=out)
    _print_fabric("electrical rails", result.electrical, out)
    print(file=out)
    _print_fabric("photonic rails", result.photonic, out)
    print(file=out)
    j = result.to_json()
    print(f"photonic saves {j['cost_saving_pct']:.2f} % of the cost "
          f"(paper, Fig. 7: {j['paper']['cost_saving_pct']} %)", file=out)
    print(f"           and {j['power_saving_pct']:.2f} % of the power "
          f"(paper, Fig. 7: {j['paper']['power_saving_pct']} %); fibre excluded", file=out)
    print(file=out)
    # the cluster's own column only where it is not the paper's H200 one (8 GPUs, 2 ports)
    own = any(r["gpus"] != r["gpus_h200"] for r in rows)
    print("Table 3: GPUs one OCS per rail connects (GPUs per server x radix / NIC ports per "
          "GPU)", file=out)
    print(f"  GB200: 72 GPUs per server, H200: 8, each GPU 2 NIC ports; this cluster "
          f"({c.gpus_per_server} GPUs, {c.nic_ports} ports) "
          + ("has its own column" if own else "is the H200 column"), file=out)
    print(f"  {'technology':<27} {'switch ms':>10} {'radix':>6} {'GB200':>7} {'H200':>6}"
          + (f" {'this cluster':>12}" if own else ""), file=out)
    for r in rows:
        print(f"  {r['label']:<27} {r['switching_ms']:>10g} {r['radix']:>6} "
              f"{r['gpus_gb200']:>7} {r['gpus_h200']:>6}"
              + (f" {r['gpus']:>12}" if own else ""), file=out)
