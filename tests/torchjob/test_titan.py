"""TorchTitan jobs without running them: the experiment key, the version pin, the assets."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest

from testbed.torchjob import titan_compat
from testbed.torchjob.config import (
    TITAN_SCRIPT,
    is_torch_experiment,
    load_torch_experiment,
    parse_torch_experiment,
)
from testbed.torchjob.titan_assets import corpus_lines
from testbed.torchjob.titan_main import titan_argv
from workloads.errors import WorkloadConfigError
from workloads.schedule import Schedule

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torchtitan" / "llama3-debug-4x1.yaml"

GOOD = """\
name: t
cluster: {servers: 4, gpus_per_server: 1}
workload:
  torchtitan:
    module: llama3
    config: llama3_debugmodel
    overrides: [--parallelism.pipeline_parallel_degree, 2, --training.seq_len, 64]
run: {warmup: 1, iterations: 2, seed: 5}
"""


def test_a_titan_workload_runs_the_trainer_with_steps_seed_and_the_compat_flags() -> None:
    exp = parse_torch_experiment(GOOD, "t.yaml")
    assert exp.torch.script == TITAN_SCRIPT and TITAN_SCRIPT.is_file()
    assert exp.torch.titan == {"module": "llama3", "config": "llama3_debugmodel"}
    argv = exp.torch.argv(steps=exp.total_iterations, seed=exp.seed)
    assert argv[:4] == ["--module", "llama3", "--config", "llama3_debugmodel"]
    assert " ".join(titan_compat.REQUIRED_ARGS) in " ".join(argv)
    assert argv[argv.index("--training.steps") + 1] == "3"
    assert argv[argv.index("--debug.seed") + 1] == "5"
    assert argv[-4:] == ["--parallelism.pipeline_parallel_degree", "2", "--training.seq_len",
                         "64"]


def test_the_shipped_example_parses() -> None:
    assert is_torch_experiment(EXAMPLE)
    exp = load_torch_experiment(EXAMPLE)
    assert exp.world_size == 4 and exp.torch.titan is not None


@pytest.mark.parametrize(("change", "key"), [
    ("    config: llama3_debugmodel\n", "workload.torchtitan.config"),
    ("    module: llama3\n", "workload.torchtitan.module"),
    ("    overrides: [--parallelism.pipeline_parallel_degree, 2, --training.seq_len, 64]\n",
     "workload.torchtitan.overrides[0]"),
    ("    module: llama3\n", "workload.torchtitan.unknown"),
])
def test_a_bad_titan_workload_names_the_key(change: str, key: str) -> None:
    replacement = {"workload.torchtitan.overrides[0]": "    overrides: [--training.steps=9]\n",
                   "workload.torchtitan.unknown": change + "    unknown: 1\n"}.get(key, "")
    with pytest.raises(WorkloadConfigError) as err:
        parse_torch_experiment(GOOD.replace(change, replacement), "t.yaml")
    assert key.removesuffix(".unknown") in str(err.value) and "t.yaml:" in str(err.value)


def test_torch_and_torchtitan_together_are_refused() -> None:
    text = GOOD.replace("workload:\n", "workload:\n  torch: {script: x.py}\n")
    with pytest.raises(WorkloadConfigError, match="exactly one"):
        parse_torch_experiment(text, "t.yaml")


@pytest.mark.parametrize(("titan", "torch", "says"), [
    ("0.2.2", "2.13.0+cpu", "torchtitan 0.2.2 is installed"),
    ("0.3.0", "2.14.1", "torch 2.14.1 is installed"),
    (None, "2.13.0", "not installed"),
])
def test_other_versions_are_refused_naming_the_pin(titan: str | None, torch: str,
                                                   says: str, monkeypatch: pytest.MonkeyPatch
                                                   ) -> None:
    if titan is None:
        monkeypatch.setattr(titan_compat, "_installed", lambda name: None)
    with pytest.raises(titan_compat.TitanVersionError) as err:
        titan_compat.check_versions(titan, torch)
    assert says in str(err.value) and "torchtitan==0.3.0" in str(err.value)


def test_the_pinned_pair_is_accepted() -> None:
    titan_compat.check_versions("0.3.0", "2.13.0+cpu")
    titan_compat.check_versions("0.3.0", "2.13.1")


def test_the_assets_paths_are_added_unless_overridden(tmp_path: Path) -> None:
    argv = titan_argv(["--module", "llama3", "--hf_assets_path=/mine"], corpus=tmp_path / "c",
                      tokenizer=tmp_path / "t", dump=tmp_path / "d")
    assert argv.count("--hf_assets_path=/mine") == 1 and "--hf_assets_path" not in argv
    assert argv[argv.index("--dataloader.dataset_path") + 1] == str(tmp_path / "c")
    assert argv[argv.index("--dump_folder") + 1] == str(tmp_path / "d")


def test_the_corpus_is_the_same_on_every_machine() -> None:
    a, b = corpus_lines(20), corpus_lines(20)
    assert a == b and len(a) == 20 and all(line.endswith(".") for line in a)
    assert json.loads(json.dumps({"text": a[0]}))["text"] == a[0]


def _titan_capture() -> dict[int, list[dict]]:
    """``data/titan-2x2.jsonl.gz``: step 3's records of the loopback reference of
    ``examples/torchtitan/llama3-debug-4x1.yaml`` (TorchTitan 0.3.0, torch 2.13.0 CPU)."""
    recs: dict[int, list[dict]] = defaultdict(list)
    with gzip.open(Path(__file__).parent / "data" / "titan-2x2.jsonl.gz", "rt") as fh:
        for line in fh:
            rec = json.loads(line)
            recs[rec["rank"]].append(rec)
    return recs


def test_generated_and_captured_titan_differ_only_as_documented() -> None:
    """The differences workloads/FORMAT.md lists for TorchTitan 0.3.0, and no others."""
    from testbed.torchjob.capture import schedule_from_records
    from workloads.compare import compare, load_any

    generated = load_any(EXAMPLE.parent / "llama3-debug-generated.yaml")
    captured = schedule_from_records(_titan_capture(), iteration=2, gpus_per_server=1)
    rep = compare(generated, captured)
    phases = {rank: {side: [(p["axis"], p["kind"], p["calls"], p["message_bytes"])
                            for p in rep["ranks"][str(rank)][side]] for side in ("a", "b")}
              for rank in (0, 2)}
    # stage 0: the previous step's 3 loss-logging all-reduces and the token count open the
    # step; the gradient-norm all-reduce carries one fp32 per parameter tensor (22)
    a, b = phases[0]["a"], phases[0]["b"]
    assert b[0] == ("dp", "allreduce", 4, 4 + 4 + 8 + 8) and a[-1] == ("dp", "allreduce", 3, 16)
    assert a[:3] == b[1:4] and a[4] == b[5] == ("pp", "allreduce", 1, 4)
    assert a[3] == ("dp", "allreduce", 1, 4) and b[4] == ("dp", "allreduce", 1, 22 * 4)
    # stage 1: the chunked loss gathers [norm, output] 2m + 1 times and reduces it in every
    # micro-batch (output only, then both), the norm's last gradient at the end
    a, b = phases[2]["a"], phases[2]["b"]
    root_ag = sum(1 for c in captured.ops_of(2) if c.kind == "all_gather"
                  and c.size_bytes == 524544)
    assert root_ag == 2 * 2 + 1
    rs = [c.size_bytes for c in captured.ops_of(2) if c.kind == "reduce_scatter"]
    assert rs == [2097152, 2098176, 3409920, 3409920, 3409920, 1024]
    assert [c.size_bytes for c in generated.ops_of(2) if c.kind == "reduce_scatter"] == [
        3409920, 3409920, 3409920, 2098176]
    assert b[-1] == ("pp", "allreduce", 1, 4) and b[-2] == ("dp", "allreduce", 1, 23 * 4)
    assert (rep["ranks"]["0"]["boundaries"], rep["ranks"]["2"]["boundaries"]) == (
        {"a": 4, "b": 3}, {"a": 7, "b": 7})
    # every other message size agrees exactly
    for rank in range(4):
        sizes = {side: {(o.kind, o.size_bytes) for o in s.ops_of(rank)
                        if o.is_collective and o.size_bytes > 1024 and o.size_bytes != 2097152}
                 for side, s in (("a", generated), ("b", captured))}
        assert sizes["a"] == sizes["b"]


def _records(name: str) -> dict[int, list[dict]]:
    recs: dict[int, list[dict]] = defaultdict(list)
    with gzip.open(Path(__file__).parent / "data" / name, "rt") as fh:
        for line in fh:
            rec = json.loads(line)
            recs[rec["rank"]].append(rec)
    return recs


def test_generated_b24_order_is_torchtitans_call_for_call() -> None:
    """The artifact's structure (reshard "always", full AC, 1F1B, 3 micro-batches, plain loss)
    in ``data/titan-b24-2x2.jsonl.gz``: step 3 of ``examples/torchtitan/llama3-debug-b24-4x1.yaml``
    on loopback (TorchTitan 0.3.0, torch 2.13.0 CPU). Every FSDP2 and pipeline call agrees in
    kind, group and size, in order; only TorchTitan's own all-reduces differ (FORMAT.md)."""
    from testbed.torchjob.capture import schedule_from_records
    from workloads.compare import compare, load_any

    generated = load_any(EXAMPLE.parent / "llama3-debug-b24-generated.yaml")
    captured = schedule_from_records(_records("titan-b24-2x2.jsonl.gz"), iteration=2,
                                     gpus_per_server=1)

    def calls(s: Schedule, rank: int) -> list[tuple[str, str, int]]:
        return [(o.kind, o.axis, o.size_bytes) for o in s.ops_of(rank) if o.is_collective]

    tensors = {0: 22, 1: 22, 2: 23, 3: 23}  # parameter tensors of the stage (grad-norm bytes)
    for rank in range(4):
        gen, cap = calls(generated, rank), calls(captured, rank)
        # the previous step's 3 loss-logging all-reduces and the token count open the capture
        assert cap[:4] == [("all_reduce", "fsdp", n) for n in (4, 4, 8, 8)]
        assert gen[-3:] == [("all_reduce", "fsdp", n) for n in (4, 4, 8)]
        norm = ("all_reduce", "fsdp", 4)
        assert gen[-5] == norm and cap[-2] == ("all_reduce", "fsdp", 4 * tensors[rank])
        assert gen[:-5] == cap[4:-2] and gen[-4] == cap[-1] == ("all_reduce", "pp", 4)
    # in detail: the last stage gathers [norm, output] after its blocks in the first forward and
    # reduces it last; stage 0's embedding is gathered first forward, last backward
    root0, root1, block = 524288, 524544, 852480
    ag = {r: [size for kind, _, size in calls(generated, r) if kind == "all_gather"]
          for r in (0, 2)}
    assert ag[0][:4] == [root0, block, block, block] and ag[0][8:12] == [block] * 3 + [root0]
    assert ag[2][:8] == [block, block, block, root1, root1, block, block, block]
    assert [s for k, _, s in calls(generated, 2) if k == "reduce_scatter"] == [3409920] * 3 + [
        2098176]
    assert len(ag[0]) == len(ag[2]) == 16  # F0, F1, B0, B1 on stage 0; F0, B0, B1, B2 on 1
    rep = compare(generated, captured, [0, 2])["ranks"]
    assert [(rep[r]["boundaries"], rep[r]["boundaries_cyclic"]) for r in ("0", "2")] == [
        ({"a": 10, "b": 9}, {"a": 10, "b": 10}), ({"a": 9, "b": 9}, {"a": 10, "b": 10})]
