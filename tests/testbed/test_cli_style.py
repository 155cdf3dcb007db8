"""One CLI style: --version, defaults in --help, every --help example real, the same OCS
protocol flags on every ``ocs`` action, exit 2 and no traceback for a user's mistakes."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from testbed.cli.main import build_parser, main
from testbed.cli.traces import compare_parser, is_compare

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "examples" / "tiny.yaml")


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                out += _parsers(child)
    return out


def _examples() -> list[str]:
    """Every ``opus-testbed ...`` line of every epilog, its comment removed."""
    lines = []
    for p in _parsers(build_parser()):
        for line in (p.epilog or "").splitlines():
            if line.strip().startswith("opus-testbed "):
                lines.append(line.split("#")[0].strip())
    return lines


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert re.fullmatch(r"opus-testbed \S+\n", capsys.readouterr().out)


def test_every_help_example_parses_and_names_files_that_exist() -> None:
    examples = _examples()
    assert len(examples) >= 15 and any(e.startswith("opus-testbed ocs ") for e in examples)
    for example in examples:
        words = shlex.split(example)[1:]
        for word in words:
            if word.startswith("examples/"):
                assert (ROOT / word).exists(), f"{example}: {word} does not exist"
        if is_compare(words):
            compare_parser().parse_args(words[2:])
        else:
            build_parser().parse_args(words)  # exits 2 on an example that does not parse


def test_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, wanted in ((["sweep", "--help"], ["(default 0,1,10,25,50,100,250,500)",
                                                "(default: 2)", "(default: emu)"]),
                         (["ocs", "simulate", "--help"], ["(default 16x16)",
                                                          "(default netconf; same as"])):
        with pytest.raises(SystemExit):
            main(argv)
        text = " ".join(capsys.readouterr().out.split())
        for w in wanted:
            assert w in text, (argv, w)


@pytest.mark.parametrize("action", [["simulate"], ["status"], ["connect", "1", "2"],
                                    ["disconnect", "1", "2"]])
def test_every_ocs_action_takes_protocol_and_driver_alike(action: list[str]) -> None:
    target = [] if action == ["simulate"] else ["--host", "127.0.0.1"]
    by_protocol = build_parser().parse_args(["ocs", *action, "--protocol", "tl1", *target])
    by_driver = build_parser().parse_args(["ocs", *action, "--driver", "polatis-tl1", *target])
    assert by_protocol.protocol == by_driver.protocol == "tl1"


@pytest.mark.parametrize("argv", [
    ["run", "missing.yaml", "--backend", "sim"],
    ["run", TINY, "--backend", "sim", "--delay", "-5"],
    ["run", TINY, "--backend", "bogus"],
    ["sweep", TINY, "--backend", "sim", "--delays", "1,x"],
    ["sweep", TINY, "--backend", "sim", "--modes", "nope"],
    ["workload", "missing.yaml"],
    ["workload", TINY, "--rail-gbps", "0"],
    ["workload", TINY, "--rank", "99"],
    ["import", "kineto", "missing.json", "--out", "OUT"],
    ["ocs", "status"],
    ["ocs", "status", "--driver", "bogus", "--host", "127.0.0.1"],
    ["ocs", "simulate", "--size", "4x8"],
    ["cost", "--servers", "0"],
])
def test_common_mistakes_exit_2_without_a_traceback(
        argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2 if exc.code else 0
    err = capsys.readouterr().err
    assert code == 2, (argv, err)
    assert "Traceback" not in err and "error" in err
    if "--delay" in argv:  # the value came from the command line: blame it, not the file
        assert "argument --delay" in err and "tiny.yaml" not in err
    if "--delays" in argv:  # like --delay: the item named, every accepted word listed
        assert "argument --delays: item 2 of '1,x'" in err and "mems" in err
        assert "could not convert" not in err


def test_sweep_delays_take_what_delay_takes() -> None:
    from testbed.cli.experiments import _delays_and_modes

    args = build_parser().parse_args(["sweep", TINY, "--delays", "0,sip,mems,25"])
    assert _delays_and_modes(args)[0] == [0.0, 0.007, 15.0, 25.0]
    args = build_parser().parse_args(["ladder", TINY, "--delays", "piezo,liquid-crystal"])
    assert _delays_and_modes(args)[0] == [25.0, 100.0]
