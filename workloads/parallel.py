"""Parallelism degrees of a workload: the shape of the device mesh and the options that change
its traffic.

Kept apart from :mod:`workloads.config` because the rank layout (:mod:`workloads.layout`) needs
the degrees and the workload's validation needs the layout's groups: with both here, config and
layout each import this module and not each other.
"""

from __future__ import annotations

from dataclasses import dataclass

PP_SCHEDULES = ("1f1b", "interleaved")
FSDP_UNITS = ("block", "block-root", "stage")
#: How the layers are split over the pipeline chunks (:func:`split_layers`).
PP_LAYER_SPLITS = ("even", "torchtitan")
#: TorchTitan's ``fsdp_reshard_after_forward`` names and the field value each stands for.
RESHARD_POLICIES: dict[str, bool | None] = {"default": None, "always": True, "never": False}


@dataclass(frozen=True)
class ParallelConfig:
    """Degrees of each parallelism axis and the options that change their traffic.

    ``fsdp`` is the ZeRO-3 sharding degree (1 = no sharding; gradients then sync by DDP
    all-reduce buckets over ``dp``); ``dp`` > 1 together with ``fsdp`` > 1 is HSDP (shard inside,
    replicate across). ``reshard_after_forward`` is TorchTitan's ``fsdp_reshard_after_forward``:
    ``None`` ("default") reshards when PP is off and keeps the gathered parameters when PP is
    on, ``True`` ("always") reshards after every forward, ``False`` ("never") keeps them (the
    builder's docstring says what each means for the all-gathers). ``fsdp_unit`` is the FSDP
    wrapping: ``block``, one unit per transformer block plus one for the stage's leftover
    parameters, each in module order (TorchTitan: the embedding, the blocks, ``[norm,
    output]``); ``block-root``, the blocks plus the stage module itself as the root unit that
    holds the leftovers (gathered first in a forward and reduced first, wherever they sit);
    ``stage``, one unit holding the whole stage. ``pp_layer_split`` is how the layers are split
    over the pipeline chunks (:func:`split_layers`): ``even``, or ``torchtitan`` (the embedding
    and the output head count as a layer each).
    """

    tp: int = 1
    sp: bool = False
    dp: int = 1
    fsdp: int = 1
    reshard_after_forward: bool | None = None
    fsdp_unit: str = "block"
    pp: int = 1
    pp_layer_split: str = "even"
    pp_schedule: str = "1f1b"
    virtual_stages: int = 1
    cp: int = 1
    ep: int = 1

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.fsdp * self.cp * self.tp

    @property
    def data_parallel(self) -> int:
        """Ranks that see different samples (``dp * fsdp``)."""
        return self.dp * self.fsdp

    @property
    def reshard(self) -> bool:
        """Effective reshard-after-forward policy."""
        if self.reshard_after_forward is None:
            return self.pp == 1
        return self.reshard_after_forward

    @property
    def chunks(self) -> int:
        """Model chunks in the pipeline (``pp * virtual_stages``)."""
        return self.pp * self.virtual_stages


def split_layers(n_layers: int, chunks: int, rule: str = "even") -> list[range]:
    """Layer ranges of each pipeline chunk.

    ``even``: ``n_layers // chunks`` each, the remainder to the middle chunks, then the last,
    then the first. ``torchtitan``: TorchTitan's ``generate_llm_fqn_per_model_part`` with
    input and output weight 1: the embedding and the output head count as one layer each,
    ``(n_layers + 2) // chunks`` such slots a chunk, the remainder to the first chunks.

    Here rather than in :mod:`workloads.builder` (which uses it) because the workload's
    validation (:mod:`workloads.config`) checks the split too, and the builder imports config.
    """
    if rule == "torchtitan" and chunks > 1:
        per, extra = divmod(n_layers + 2, chunks)
        counts = [per + (c < extra) for c in range(chunks)]
        counts[0] -= 1
        counts[-1] = n_layers - sum(counts[:-1])
    else:
        base, extra = divmod(n_layers, chunks)
        counts = [base] * chunks
        order = list(range(1, chunks - 1)) + ([chunks - 1, 0] if chunks > 1 else [0])
        for c in order[:extra]:
            counts[c] += 1
    out, start = [], 0
    for n in counts:
        out.append(range(start, start + n))
        start += n
    return out
