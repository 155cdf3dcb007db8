"""The script every rank of a TorchTitan job runs: TorchTitan's own trainer, unmodified.

The launcher (:mod:`testbed.torchjob.launcher`) runs this file as ``__main__`` with the
arguments built from ``workload: {torchtitan: ...}`` (:mod:`testbed.torchjob.config`). Before
the trainer is imported it

* applies the pinned compatibility patches (:mod:`testbed.torchjob.titan_compat`), which
  refuse other versions of torchtitan or torch;
* builds or finds the local tokenizer and corpus (:mod:`testbed.torchjob.titan_assets`) and
  points ``--hf_assets_path`` and ``--dataloader.dataset_path`` at them (unless the overrides
  do), with Hugging Face libraries kept offline;
* makes ``opus`` the CPU's default backend (``Backend.default_device_backend_map["cpu"]``),
  which TorchTitan's ``init_distributed`` and every ``DeviceMesh`` group then use;
* reports each logged step's loss on standard output as ``{"step": N, "loss": float.hex}``
  (what :mod:`testbed.torchjob.losses` compares bit for bit), next to TorchTitan's own line.

TorchTitan's dump folder (structured logs) is ``rank<r>.titan/`` beside the rank's log.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

HERE = str(Path(__file__).resolve().parent)


def _has(argv: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def titan_argv(argv: list[str], *, corpus: Path, tokenizer: Path, dump: Path | None
               ) -> list[str]:
    """``argv`` with the assets' paths and the dump folder, where the overrides left them (put
    first: a subcommand such as ``activation_checkpoint:none`` must stay last)."""
    extra = []
    if not _has(argv, "--hf_assets_path"):
        extra += ["--hf_assets_path", str(tokenizer)]
    if not _has(argv, "--dataloader.dataset_path"):
        extra += ["--dataloader.dataset_path", str(corpus)]
    if dump is not None and not _has(argv, "--dump_folder"):
        extra += ["--dump_folder", str(dump)]
    return [*extra, *argv]


def _report_losses() -> None:
    from torchtitan.components import metrics

    log = metrics.MetricsProcessor.log

    def report(self: Any, step: int, global_avg_loss: float, *args: Any, **kwargs: Any) -> Any:
        print(json.dumps({"step": int(step), "loss": float(global_avg_loss).hex()}), flush=True)
        return log(self, step, global_avg_loss, *args, **kwargs)

    metrics.MetricsProcessor.log = report


def main() -> None:
    """Run TorchTitan's trainer with ``sys.argv[1:]``."""
    while HERE in sys.path:  # the launcher put this folder first; its modules are not top-level
        sys.path.remove(HERE)
    from testbed.torchjob import titan_compat
    from testbed.torchjob.titan_assets import ensure_assets

    titan_compat.apply()
    assets = ensure_assets()
    os.environ.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                       "HF_DATASETS_CACHE": str(assets.root / "hf-datasets"),
                       "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"})
    import torch.distributed as dist

    from testbed.torchjob.backend import BACKEND

    dist.Backend.default_device_backend_map["cpu"] = BACKEND
    _report_losses()
    log = os.environ.get("OPUS_RANK_LOG")
    dump = Path(log).with_suffix(".titan") if log else None
    sys.argv = [sys.argv[0], *titan_argv(sys.argv[1:], corpus=assets.corpus_dir,
                                         tokenizer=assets.tokenizer_dir, dump=dump)]
    from torchtitan.train import main as train

    train()


if __name__ == "__main__":
    main()
