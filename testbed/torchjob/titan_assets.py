"""The local assets a TorchTitan job reads: a JSONL text corpus and a tokenizer trained on it.

TorchTitan's wheel ships neither a tokenizer nor a test dataset, and this project copies
nothing from its repository. Both are made here, from text this module writes: sentences
about photonic rails drawn from a small word list with a seeded generator, so that every
machine builds the same files byte for byte. The tokenizer is a byte-level BPE model trained
with Hugging Face ``tokenizers`` on that corpus (at most :data:`VOCAB_SIZE` ids, within
``llama3_debugmodel``'s vocabulary of 2048).

::

    <cache>/titan-assets-v1/
        corpus/train.jsonl          {"text": ...} per line (the dataloader's c4-style rows)
        tokenizer/tokenizer.json    the trained model
        tokenizer/tokenizer_config.json   bos/eos token names

The cache is ``$OPUS_TITAN_ASSETS`` or ``~/.cache/opus-testbed``; :func:`ensure_assets`
builds it once (atomically: a half-written folder is never used).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

VERSION = "titan-assets-v1"
VOCAB_SIZE = 1024
DOCUMENTS = 600
SEED = 28
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"

_SUBJECTS = ("the controller", "a rail", "the optical switch", "each rank", "the pipeline stage",
             "a circuit", "the fabric", "the scheduler", "every server", "the gradient shard",
             "the job", "a port", "the mirror array", "the all-gather", "the reduce-scatter")
_VERBS = ("lights", "breaks", "waits for", "reconfigures", "carries", "predicts", "measures",
          "sends", "receives", "rewires", "schedules", "provisions", "reduces", "gathers")
_OBJECTS = ("the next phase", "a new matching", "its peer", "the dark period", "eight gigabytes",
            "the parameters", "the activations", "one micro-batch", "the window", "the ring",
            "a fresh circuit", "the frontend", "the loss", "the optimizer state")
_TAILS = ("before the step ends", "within a millisecond", "after the forward pass",
          "on every iteration", "while the GPUs compute", "between two collectives",
          "as the paper predicts", "without dropping a byte", "at the start of backward",
          "once the previous call completes")


@dataclass(frozen=True)
class TitanAssets:
    """Where a job finds its dataset (``--dataloader.dataset_path``) and tokenizer
    (``--hf_assets_path``)."""

    root: Path

    @property
    def corpus_dir(self) -> Path:
        return self.root / "corpus"

    @property
    def tokenizer_dir(self) -> Path:
        return self.root / "tokenizer"


def default_cache() -> Path:
    """``$OPUS_TITAN_ASSETS``, else ``~/.cache/opus-testbed``."""
    env = os.environ.get("OPUS_TITAN_ASSETS")
    return Path(env) if env else Path.home() / ".cache" / "opus-testbed"


def corpus_lines(documents: int = DOCUMENTS, seed: int = SEED) -> list[str]:
    """The corpus's documents: a few sentences each, from a seeded generator."""
    rng = random.Random(seed)
    out = []
    for _ in range(documents):
        sentences = []
        for _ in range(rng.randint(3, 9)):
            words = (rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS),
                     rng.choice(_TAILS))
            sentence = " ".join(words)
            sentences.append(sentence[0].upper() + sentence[1:] + ".")
        out.append(" ".join(sentences))
    return out


def _write(root: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    docs = corpus_lines()
    (root / "corpus").mkdir(parents=True)
    with (root / "corpus" / "train.jsonl").open("w") as fh:
        for text in docs:
            fh.write(json.dumps({"text": text}) + "\n")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer)
    (root / "tokenizer").mkdir()
    tok.save(str(root / "tokenizer" / "tokenizer.json"))
    config = {"bos_token": BOS, "eos_token": EOS, "model_max_length": 1 << 20,
              "tokenizer_class": "PreTrainedTokenizerFast"}
    (root / "tokenizer" / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def ensure_assets(cache: Path | None = None) -> TitanAssets:
    """The assets under ``cache`` (default :func:`default_cache`), built if missing."""
    base = cache if cache is not None else default_cache()
    root = base / VERSION
    if not (root / "tokenizer" / "tokenizer_config.json").is_file():
        base.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{VERSION}-", dir=base))
        try:
            _write(tmp / "assets")
            try:
                (tmp / "assets").rename(root)
            except OSError:  # built meanwhile by another process: keep theirs
                if not (root / "tokenizer" / "tokenizer_config.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return TitanAssets(root)


def main() -> None:
    """``python -m testbed.torchjob.titan_assets [CACHE]``: build the assets, print the path."""
    import sys

    print(ensure_assets(Path(sys.argv[1]) if len(sys.argv) > 1 else None).root)


if __name__ == "__main__":
    main()
