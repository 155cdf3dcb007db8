"""Workload configuration: model, parallelism, batch, cluster and GPU, with validation.

The device mesh is ``[pp, dp, fsdp, cp, tp]`` from outermost to innermost (TP innermost so that
a TP group sits inside one server, as TorchTitan and Megatron-LM lay it out). Expert
parallelism does not add ranks: EP groups are carved out of the data-parallel ranks
(``dp * fsdp``), as Megatron-LM's expert-data-parallel layout does, so ``ep`` must divide
``dp * fsdp``.

The degrees themselves are :class:`workloads.parallel.ParallelConfig`.
Collective algorithms (``algorithms``) and stragglers (``stragglers``) are part of the workload:
they change what each rank sends (:mod:`workloads.algorithms`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from workloads.algorithms import ALGORITHMS, DEFAULT_ALGORITHM, check_algorithm, is_power_of_two
from workloads.errors import WorkloadConfigError
from workloads.hardware import Cluster, GpuSpec, get_gpu
from workloads.layout import AXES, build_groups
from workloads.models import ModelSpec
from workloads.parallel import (
    FSDP_UNITS,
    PP_LAYER_SPLITS,
    PP_SCHEDULES,
    ParallelConfig,
    split_layers,
)

ACTIVATION_CHECKPOINTING = ("none", "full")
_PAR = "workload.parallelism"  # the key prefix of the degrees in error messages


@dataclass(frozen=True)
class Straggler:
    """A persistent straggler: rank ``rank`` reaches each of its network all-reduces
    ``delay_s`` late (StragglAR's setting, arXiv 2505.23523: a GPU that is late by the same
    delay iteration after iteration). The replay adds the delay as compute before each."""

    rank: int
    delay_s: float


@dataclass(frozen=True)
class WorkloadConfig:
    """Everything the generator needs for one training iteration.

    ``activation_checkpointing``: ``none``, or ``full`` (TorchTitan's full AC: every transformer
    block's forward runs again inside its backward, with its compute and its TP/CP/EP
    collectives). ``loss_logging_allreduces``: the tiny all-reduces TorchTitan's training loop
    issues on the data-parallel group after the optimizer step to log the loss (3 with
    ``log_freq = 1``). ``calibrate_step_s``: the measured step time the modelled electrical step
    is calibrated to (:mod:`workloads.calibrate`), which sets ``compute_scale``, the factor every
    compute duration is multiplied by.

    ``model`` is None in a captured or imported schedule (``workloads/FORMAT.md``): its ops
    come from a real run, not from a model, and ``parallel`` holds the degrees of its groups.
    """

    model: ModelSpec | None
    cluster: Cluster
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    seq_len: int = 8192
    micro_batch_size: int = 1
    num_microbatches: int = 1
    gpu: GpuSpec = field(default_factory=lambda: get_gpu("a100"))
    mfu: float = 0.4
    ddp_bucket_mb: float = 25.0  # PyTorch DDP's bucket_cap_mb default
    param_dtype_bytes: int = 2  # bf16 parameters for compute / FSDP all-gather
    reduce_dtype_bytes: int = 4  # fp32 gradient reduction (TorchTitan's mixed precision)
    act_dtype_bytes: int = 2  # bf16 activations
    activation_checkpointing: str = "none"
    loss_logging_allreduces: int = 0
    calibrate_step_s: float | None = None
    compute_scale: float = 1.0
    # (kind, axis or "" for every axis, algorithm); :data:`workloads.algorithms.ALGORITHMS`
    algorithms: tuple[tuple[str, str, str], ...] = ()
    stragglers: tuple[Straggler, ...] = ()

    def algorithm_for(self, kind: str, axis: str) -> str:
        """The algorithm chosen for collectives of ``kind`` on ``axis`` (default: the first
        of the kind's algorithms)."""
        return chosen_algorithm(self.algorithms, kind, axis)

    @property
    def straggler_delay_s(self) -> dict[int, float]:
        """Delay of each straggler rank."""
        return {s.rank: s.delay_s for s in self.stragglers}

    @property
    def model_spec(self) -> ModelSpec:
        """The model, for what needs one (generation); refused for a captured schedule."""
        if self.model is None:
            raise WorkloadConfigError("required: a captured or imported schedule has no model "
                                      "to generate from", "workload.model")
        return self.model

    def validate(self) -> None:
        """Raise :class:`WorkloadConfigError` naming the field of the first problem found."""
        self.model_spec.validate()
        self._validate_ranges()
        self._validate_mesh()
        self._validate_pipeline()
        self._validate_stragglers()
        self._validate_algorithms()

    def _validate_ranges(self) -> None:
        """Each number on its own: degrees, sizes and factors in their ranges."""
        p, c = self.parallel, self.cluster
        for name in ("tp", "dp", "fsdp", "pp", "cp", "ep", "virtual_stages"):
            if int(getattr(p, name)) < 1:
                raise WorkloadConfigError("must be an integer >= 1", f"{_PAR}.{name}")
        for name in ("servers", "gpus_per_server"):
            if int(getattr(c, name)) < 1:
                raise WorkloadConfigError("must be an integer >= 1", f"cluster.{name}")
        for name in ("seq_len", "micro_batch_size", "num_microbatches"):
            if int(getattr(self, name)) < 1:
                raise WorkloadConfigError("must be an integer >= 1", f"workload.{name}")
        if not 0.0 < self.mfu <= 1.0:
            raise WorkloadConfigError("must be in (0, 1]", "workload.mfu")
        if self.ddp_bucket_mb <= 0:
            raise WorkloadConfigError("must be positive", "workload.ddp_bucket_mb")
        if self.activation_checkpointing not in ACTIVATION_CHECKPOINTING:
            raise WorkloadConfigError(
                f"must be one of {', '.join(ACTIVATION_CHECKPOINTING)}, got "
                f"{self.activation_checkpointing!r}", "workload.activation_checkpointing")
        if int(self.loss_logging_allreduces) < 0:
            raise WorkloadConfigError("must be an integer >= 0",
                                      "workload.loss_logging_allreduces")
        if self.calibrate_step_s is not None and not self.calibrate_step_s > 0:
            raise WorkloadConfigError(f"must be > 0 s, got {self.calibrate_step_s!r}",
                                      "workload.calibrate_step_s")
        if not self.compute_scale > 0:
            raise WorkloadConfigError(f"must be > 0, got {self.compute_scale!r}",
                                      "workload.compute_scale")

    def _validate_mesh(self) -> None:
        """The degrees against the cluster and the model: TP inside a server, the world size,
        EP carved out of the data-parallel ranks."""
        p, c, model = self.parallel, self.cluster, self.model_spec
        if p.tp > c.gpus_per_server:
            raise WorkloadConfigError(
                f"tp={p.tp} is larger than a server ({c.gpus_per_server} GPUs); TP must stay "
                "inside the scale-up domain", f"{_PAR}.tp")
        if c.gpus_per_server % p.tp:
            raise WorkloadConfigError(
                f"tp={p.tp} does not divide gpus_per_server={c.gpus_per_server}", f"{_PAR}.tp")
        if p.world_size != c.world_size:
            raise WorkloadConfigError(
                f"pp*dp*fsdp*cp*tp = {p.pp}*{p.dp}*{p.fsdp}*{p.cp}*{p.tp} = {p.world_size} "
                f"does not equal the world size {c.servers}*{c.gpus_per_server} = "
                f"{c.world_size}", f"{_PAR}.{_first_non_unit(p)}")
        if p.ep > 1 and not model.is_moe:
            raise WorkloadConfigError(
                f"ep={p.ep} but model {model.name!r} has no experts", f"{_PAR}.ep")
        if p.data_parallel % p.ep:
            raise WorkloadConfigError(
                f"ep={p.ep} does not divide dp*fsdp={p.data_parallel} (EP groups are carved "
                "out of the data-parallel ranks)", f"{_PAR}.ep")
        if model.is_moe and p.ep > model.n_experts:
            raise WorkloadConfigError(
                f"ep={p.ep} exceeds the {model.n_experts} experts", f"{_PAR}.ep")

    def _validate_pipeline(self) -> None:
        """The pipeline schedule, FSDP wrapping and the sequence split against the model."""
        p, model = self.parallel, self.model_spec
        if p.pp_schedule not in PP_SCHEDULES:
            raise WorkloadConfigError(f"must be one of {', '.join(PP_SCHEDULES)}",
                                      f"{_PAR}.pp_schedule")
        if p.fsdp_unit not in FSDP_UNITS:
            raise WorkloadConfigError(f"must be one of {', '.join(FSDP_UNITS)}",
                                      f"{_PAR}.fsdp_unit")
        if p.pp_layer_split not in PP_LAYER_SPLITS:
            raise WorkloadConfigError(f"must be one of {', '.join(PP_LAYER_SPLITS)}",
                                      f"{_PAR}.pp_layer_split")
        if p.chunks <= model.n_layers and not all(
                split_layers(model.n_layers, p.chunks, p.pp_layer_split)):
            raise WorkloadConfigError(
                f"the {p.pp_layer_split} split of {model.n_layers} layers over {p.chunks} "
                "chunks leaves a chunk without a layer", f"{_PAR}.pp_layer_split")
        if p.pp_schedule == "1f1b" and p.virtual_stages != 1:
            raise WorkloadConfigError("virtual stages need pp_schedule 'interleaved'",
                                      f"{_PAR}.virtual_stages")
        if p.pp_schedule == "interleaved":
            if p.pp < 2:
                raise WorkloadConfigError("interleaved schedule needs pp >= 2",
                                          f"{_PAR}.pp_schedule")
            if self.num_microbatches % p.pp:
                raise WorkloadConfigError(
                    f"the interleaved schedule needs num_microbatches "
                    f"({self.num_microbatches}) to be a multiple of pp ({p.pp})",
                    "workload.num_microbatches")
        if p.chunks > model.n_layers:
            raise WorkloadConfigError(
                f"pp*virtual_stages={p.chunks} exceeds the {model.n_layers} layers",
                f"{_PAR}.pp")
        if self.seq_len % p.cp:
            raise WorkloadConfigError(f"seq_len={self.seq_len} is not a multiple of cp={p.cp}",
                                      f"{_PAR}.cp")
        if p.sp and (self.seq_len // p.cp) % p.tp:
            raise WorkloadConfigError(
                f"sequence parallelism needs seq_len/cp divisible by tp={p.tp}", f"{_PAR}.sp")

    def _validate_stragglers(self) -> None:
        world = self.cluster.world_size
        seen: set[int] = set()
        for i, s in enumerate(self.stragglers):
            key = f"workload.stragglers[{i}]"
            if not 0 <= s.rank < world:
                raise WorkloadConfigError(
                    f"rank {s.rank} is outside the world (0..{world - 1})", f"{key}.rank")
            if s.rank in seen:
                raise WorkloadConfigError(f"rank {s.rank} is listed twice", f"{key}.rank")
            seen.add(s.rank)
            if not s.delay_s >= 0:
                raise WorkloadConfigError("must be >= 0", f"{key}.delay_ms")

    def _validate_algorithms(self) -> None:
        groups = None
        for kind, axis, name in self.algorithms:
            key = f"workload.algorithms.{kind}" + (f".{axis}" if axis else "")
            if kind not in ALGORITHMS:
                raise WorkloadConfigError(
                    f"unknown collective kind; known: {', '.join(ALGORITHMS)}", key)
            if axis and axis not in AXES:
                raise WorkloadConfigError(f"unknown axis {axis!r}; known: {', '.join(AXES)}",
                                          key)
            try:
                algorithm = check_algorithm(kind, name)
            except ValueError as exc:
                raise WorkloadConfigError(str(exc), key) from exc
            if not algorithm.needs_straggler:
                continue
            if not self.stragglers:
                raise WorkloadConfigError(
                    "stragglar needs a straggler: add workload.stragglers "
                    "[{rank: R, delay_ms: D}]", key)
            groups = groups or build_groups(self.parallel)
            late = self.straggler_delay_s
            for ax in [axis] if axis else list(AXES):
                for members in groups[ax].ranks.tolist():
                    mine = [r for r in members if r in late]
                    if len(members) < 2 or not mine:
                        continue
                    if len(mine) > 1:
                        raise WorkloadConfigError(
                            f"a {ax} group holds stragglers {mine}; StragglAR takes one per "
                            "group", key)
                    if not is_power_of_two(len(members)):
                        raise WorkloadConfigError(
                            f"StragglAR's schedule needs groups of a power-of-two size; the "
                            f"{ax} groups have {len(members)} ranks", key)


def _first_non_unit(p: ParallelConfig) -> str:
    """The degree to blame for a world-size mismatch: the largest non-TP degree."""
    degrees = {"pp": p.pp, "dp": p.dp, "fsdp": p.fsdp, "cp": p.cp, "tp": p.tp}
    return max(degrees, key=lambda k: (k != "tp", degrees[k]))


def chosen_algorithm(algorithms: Iterable[tuple[str, str, str]], kind: str, axis: str) -> str:
    """Among ``algorithms`` ((kind, axis or "" for every axis, name) choices) the one for
    collectives of ``kind`` on ``axis``: its axis's own choice, else the kind's choice for
    every axis, else the kind's default (the first of its algorithms; "" for kinds with none).
    """
    chosen = DEFAULT_ALGORITHM.get(kind, "")
    for k, a, name in algorithms:
        if k == kind and a == axis:
            return name
        if k == kind and not a:
            chosen = name
    return chosen
