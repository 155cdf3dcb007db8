"""The command line: help for every command, clear errors for bad input, JSON where promised."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from testbed.check import run_checks
from testbed.cli.main import build_parser, main

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed.cli.main", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=60, check=False)


@pytest.mark.parametrize("command", ["check", "clean", "demo", "bench", "workload", "run",
                                     "sweep", "ladder", "report", "cost", "ocs"])
def test_every_command_has_help(command: str) -> None:
    res = run_cli(command, "--help")
    assert res.returncode == 0 and "usage: opus-testbed" in res.stdout, res.stderr


def test_every_benchmark_has_help_and_json() -> None:
    bench = build_parser()._subparsers._group_actions[0].choices["bench"]  # type: ignore[union-attr]
    names = bench._subparsers._group_actions[0].choices
    assert {"fidelity", "control", "workload", "intents"} <= set(names)
    for name, parser in names.items():
        assert "--json" in parser.format_help(), name


def test_check_json_lists_each_prerequisite_with_a_verdict() -> None:
    res = run_cli("check", "--json")
    data = json.loads(res.stdout)
    names = {c["name"] for c in data["checks"]}
    assert {"root", "openvswitch", "mininet.net", "os_ken", "offload"} <= names
    assert res.returncode == (0 if data["ok"] else 1)
    assert all(c["ok"] or c["fix"] for c in data["checks"]), "a failed check without a fix hint"


def test_bad_benchmark_numbers_are_rejected_with_the_value(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as bad:
        main(["bench", "fidelity", "--delays", "1,x"])
    assert bad.value.code == 2 and "'1,x'" in capsys.readouterr().err


def test_unknown_command_is_a_usage_error() -> None:
    res = run_cli("frobnicate")
    assert res.returncode == 2 and "invalid choice" in res.stderr


def test_workload_reports_a_bad_key_with_its_position(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    good = (ROOT / "examples/llama3-8b-workload.yaml").read_text().splitlines()
    line = good.index("  gpu: a100") + 1
    config.write_text("\n".join([*good[:line], "  colour: blue", *good[line:]]) + "\n")
    res = run_cli("workload", str(config))
    assert res.returncode == 2
    out = res.stderr + res.stdout
    assert "colour" in out and f"bad.yaml:{line + 1}:" in out, out


MIB = 2**20
#: rank 0's rail phases for Llama3-8B TP4 FSDP2 PP2 (DESIGN.md, "Numbers from the paper"):
#: (axis, kind) -> (calls, MiB per call); the paper's 957 MB and 3829 MB are MiB truncated
PAPER_PHASES = [(("dp", "allgather"), 1, 957.38), (("pp", "sendrecv"), 16, 64.0),
                (("dp", "reducescatter"), 1, 3829.50), (("dp", "allreduce"), 1, 0.0),
                (("pp", "allreduce"), 1, 0.0)]


def printed_phases(text: str) -> list[tuple[tuple[str, str], int, float]]:
    """Rank 0's phase table of ``opus-testbed workload``: ((axis, kind), calls, MiB per call)."""
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:3] == ["#", "axis", "kind"])
    rows = []
    for line in lines[head + 1:]:
        if not line.strip():
            break
        _index, axis, kind, calls, _message, per_call, _wire, _start = line.split()
        rows.append(((axis, kind), int(calls), float(per_call)))
    return rows


def assert_paper_volumes(phases: list[tuple[tuple[str, str], int, float]],
                         dp: str = "dp") -> None:
    """The per-call volumes of the paper: 957 / 3829 MiB on DP, 64 MiB PP, sync < 1 MiB;
    the DP phases named ``dp`` (the FSDP calls' paper-level axis, or ``fsdp`` as printed)."""
    assert [(key, calls) for key, calls, _ in phases] == [
        ((dp if key[0] == "dp" else key[0], key[1]), calls) for key, calls, _ in PAPER_PHASES
    ], phases
    for (key, _calls, mib), (_key, _, paper_mib) in zip(phases, PAPER_PHASES, strict=True):
        if key[1] == "allreduce":
            assert mib < 1, f"{key}: sync all-reduce of {mib} MiB, the paper's is < 1 MB"
        else:
            assert mib == pytest.approx(paper_mib, abs=0.01), (key, mib)


def test_workload_prints_the_paper_volumes() -> None:
    res = run_cli("workload", "examples/llama3-8b-workload.yaml")
    assert res.returncode == 0, res.stderr
    assert "llama3-8b (8.03 B params) on 16 ranks: tp=4 dp=1 fsdp=2 pp=2" in res.stdout
    assert_paper_volumes(printed_phases(res.stdout), dp="fsdp")  # FSDP's calls, as fsdp
    assert "fsdp/all_gather" in res.stdout and "dp/all_gather" not in res.stdout.replace(
        "fsdp/", "")


def test_workload_json_has_the_paper_volumes() -> None:
    res = run_cli("workload", "examples/llama3-8b-workload.yaml", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert (data["model"], data["ranks"], data["rank"]) == ("llama3-8b", 16, 0)
    assert_paper_volumes([((p["axis"], p["kind"]), p["calls"], p["max_call_bytes"] / MIB)
                          for p in data["phases"]])
    assert [p["axes"] for p in data["phases"]] == [["fsdp"], ["pp"], ["fsdp"], ["fsdp"], ["pp"]]
    pp_sizes = {p["kind"]: p["max_call_bytes"] for p in data["phases"] if p["axis"] == "pp"}
    assert pp_sizes["sendrecv"] == 1 * 8192 * 4096 * 2  # one micro-batch's bf16 activation


def assert_run_refused(tmp_path: Path, text: str, *messages: str) -> None:
    """``run`` on experiment ``text`` exits 2 naming each message, and creates nothing."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    out = tmp_path / "out"
    res = run_cli("run", str(bad), "--out", str(out))
    assert res.returncode == 2
    for message in messages:
        assert message in res.stderr
    assert not out.exists()


def test_run_refuses_a_bad_experiment_and_starts_nothing(tmp_path: Path) -> None:
    assert_run_refused(tmp_path, "cluster: {servers: 2, gpus_per_server: 1}\n"
                       "workload: {model: llama3-8b, parallelism: {fsdp: 2}}\nmode: warp\n",
                       "bad.yaml:3:7: mode: must be one of")


FAILOVER_BASE = """\
cluster: {servers: 4, gpus_per_server: 1, spare_servers: 1}
workload: {model: llama3-8b, seq_len: 1024, parallelism: {fsdp: 2, pp: 2}}
"""


def test_run_refuses_a_fault_on_a_missing_rank_and_starts_nothing(tmp_path: Path) -> None:
    assert_run_refused(tmp_path, FAILOVER_BASE + "faults:\n  - {kind: kill, rank: 7, "
                       "at_iteration: 1}\n",
                       "bad.yaml:4:24: faults[0].rank: rank 7 does not exist")


def test_run_refuses_more_spares_than_the_machine_hosts(tmp_path: Path) -> None:
    """Each spare is a standby rank process: 4 ranks fit, 4 + 300 do not (past the emulator's
    rank limit: 4 + 200 would now fit at a time dilation of 8, the cap on ranks per core
    scaling with it)."""
    assert_run_refused(tmp_path, FAILOVER_BASE.replace("spare_servers: 1", "spare_servers: 300"),
                       "bad.yaml:1:58: cluster.spares_per_server/spare_servers: 300 spares",
                       "use fewer spares")


def test_run_refuses_a_cluster_too_big_for_this_machine(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("cluster: {servers: 64, gpus_per_server: 8}\n"
                   "workload: {model: llama3-8b, parallelism: {tp: 8, fsdp: 64}}\n")
    res = run_cli("run", str(big), "--out", str(tmp_path / "out"))
    assert res.returncode == 2
    assert "512 ranks exceed" in res.stderr and "--backend sim" in res.stderr
    assert not (tmp_path / "out").exists()


def test_run_refuses_a_bad_rank_cpu_quota_on_the_command_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as bad:
        main(["run", "examples/tiny.yaml", "--rank-cpu-quota", "1.5"])
    assert bad.value.code == 2
    assert "--rank-cpu-quota: must be a fraction of the machine's CPU in (0, 1], auto or off, " \
           "got '1.5'" in capsys.readouterr().err


def test_rank_cpu_quota_override() -> None:
    from testbed.cli.experiments import apply_overrides
    from testbed.experiment.config import load_experiment

    cfg = load_experiment(ROOT / "examples" / "tiny.yaml").replace(rank_cpu_quota="auto")
    for flag, expected in (("0.5", 0.5), ("auto", "auto"), ("off", None)):
        args = build_parser().parse_args(["run", "x.yaml", "--rank-cpu-quota", flag])
        assert apply_overrides(cfg, args).rank_cpu_quota == expected, flag
    assert apply_overrides(cfg, build_parser().parse_args(["run", "x.yaml"])
                           ).rank_cpu_quota == "auto"


def test_run_refuses_a_quota_without_a_cgroup_cpu_controller(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    from emulator import cpuquota

    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw 0 0\n")
    monkeypatch.setattr(cpuquota, "MOUNTS", mounts)
    out = tmp_path / "out"
    code = main(["run", str(ROOT / "examples" / "tiny.yaml"), "--out", str(out),
                 "--rank-cpu-quota", "0.7"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "run.rank_cpu_quota is 0.7, but no cgroup hierarchy with the cpu controller is " \
           "mounted; set it to null (or pass --rank-cpu-quota off)" in err
    assert not out.exists()
    assert main(["check"]) == (0 if all(c.passes for c in run_checks()) else 1)
    assert "[off] cpu quota: unavailable: no cgroup hierarchy" in capsys.readouterr().out


def test_report_on_a_directory_without_results_fails_clearly(tmp_path: Path) -> None:
    res = run_cli("report", str(tmp_path))
    assert res.returncode == 2 and "is not a run, a sweep or a run --baseline folder: it " \
        "holds no summary.json (a run), no sweep.csv (a sweep)" in res.stderr


def test_demo_shows_degree_aware_and_the_paper_model_with_its_rail_state_figures() -> None:
    from testbed.cli.experiments import demo_lines as lines_of
    from testbed.results.baseline import against_baseline
    from testbed.results.reference import PAPER_FIG8_100MS_PCT
    from testbed.studies.demo import BASELINE, DEMO_RUNS

    def demo_lines(title: str, runs: dict[str, dict[str, Any]],
                   artifact: dict[str, dict[str, Any]], delay_ms: float) -> list[str]:
        """The printed demo after :func:`~testbed.studies.demo.run_demo` judged its runs."""
        return lines_of(title, dict(against_baseline(runs, BASELINE)),
                        dict(against_baseline(artifact, BASELINE)), delay_ms)

    times = dict(zip([label for label, _, _ in DEMO_RUNS], [2.0, 3.0, 2.5, 2.1, 2.4, 2.2],
                     strict=True))
    runs = {label: {"iteration_time_s": t, "reconfigurations_per_iteration": 4.0,
                    "exposed_reconfig_s": 0.5, "fidelity": "ok"} for label, t in times.items()}
    artifact = {"baseline": {"iteration_time_s": 10.0},
                "rail-state on-demand": {"iteration_time_s": 10.7},
                "rail-state provisioning": {"iteration_time_s": 10.2}}
    lines = demo_lines("== demo ==", runs, artifact, 100.0)
    rows = {line.split("  ")[0].strip(): line for line in lines[2:8]}
    assert list(rows) == list(times)
    assert "+5.0 %" in rows["degree-aware K=2"] and "+50.0 %" in rows["on-demand"]
    assert "+10.0 %" in rows["rail-state provisioning"]
    text = " ".join(lines[8:])
    assert "+6.5 % on demand, +3.5 % with provisioning" in text
    assert "assumes its authors' rail-state model" in text and "not a one-to-one OCS" in text
    assert "gives +7.0 % / +2.0 % at 100 ms" in text
    assert "examples/llama3-8b-artifact.yaml, sim backend, 10.00 s baseline" in text
    assert ("this demo's step is 2.00 s, so its rail-state overheads are larger, +20.0 % / "
            "+10.0 % (docs/validation.md)") in text
    assert not any(line.startswith(("degraded", "exit status")) for line in lines)

    artifact["baseline"]["calibrate_step_s"] = 10.18  # the paper's figures and the step: data
    lines = demo_lines("== demo ==", runs, artifact, 100.0)
    assert "calibrated to a 10.18 s step, sim backend" in " ".join(lines[8:])
    for pct in PAPER_FIG8_100MS_PCT.values():
        assert f"{pct:+.1f} %" in lines[8]
    # "larger" only when the data says so
    artifact["rail-state on-demand"]["iteration_time_s"] = 13.0  # +30 % > the demo's +20 %
    text = " ".join(demo_lines("== demo ==", runs, artifact, 100.0)[8:])
    assert "larger" not in text and "smaller" not in text
    assert "this demo's step is 2.00 s; its rail-state overheads are +20.0 % / +10.0 %" in text
    artifact["rail-state provisioning"]["iteration_time_s"] = 12.0
    text = " ".join(demo_lines("== demo ==", runs, artifact, 100.0)[8:])
    assert "its rail-state overheads are smaller, +20.0 % / +10.0 %" in text
    artifact["baseline"]["iteration_time_s"] = 1.0  # a shorter artifact step: no "so"
    artifact["rail-state on-demand"]["iteration_time_s"] = 1.05
    artifact["rail-state provisioning"]["iteration_time_s"] = 1.02
    text = " ".join(demo_lines("== demo ==", runs, artifact, 100.0)[8:])
    assert "this demo's step is 2.00 s; its rail-state overheads are larger" in text

    runs["degree-aware K=2"].update(fidelity="degraded", fidelity_blame="machine",
                                    fidelity_reasons=["dark periods overran", "CPU saturated"])
    lines = demo_lines("== demo ==", runs, artifact, 100.0)
    assert lines[-2] == ("degraded degree-aware K=2 (blamed on the machine): dark periods "
                         "overran; CPU saturated")
    assert lines[-1].startswith("exit status 3: 1 of 6 rows are degraded")
