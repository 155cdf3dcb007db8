"""Parameter counts derived from the architecture, and the layer / expert splits."""

from __future__ import annotations

import pytest

from workloads import get_preset, split_experts, split_layers, total_params
from workloads.models import active_params, layer_params


def test_llama3_8b_parameter_count_from_architecture() -> None:
    # embeddings 128256*4096 twice (untied) + 32 blocks of 218,112,000 + final norm 4096
    assert layer_params(get_preset("llama3-8b"), 0).total == 218_112_000
    assert total_params(get_preset("llama3-8b")) == 2 * 525_336_576 + 32 * 218_112_000 + 4096


@pytest.mark.parametrize(("name", "billions"), [
    ("llama3-70b", 70.55), ("llama3.1-405b", 405.85), ("mixtral-8x7b", 46.70)])
def test_presets_match_published_sizes(name: str, billions: float) -> None:
    assert total_params(get_preset(name)) / 1e9 == pytest.approx(billions, abs=0.01)


def test_moe_active_parameters_count_top_k_experts() -> None:
    assert active_params(get_preset("mixtral-8x7b")) / 1e9 == pytest.approx(12.88, abs=0.01)


def test_even_layer_split() -> None:
    assert [len(r) for r in split_layers(32, 2)] == [16, 16]
    assert split_layers(32, 2)[1] == range(16, 32)


def test_uneven_layer_split_spares_first_and_last_chunks() -> None:
    # 126 layers over 16 stages: the embedding and head stages get 7, the others 8
    counts = [len(r) for r in split_layers(126, 16)]
    assert counts == [7] + [8] * 14 + [7]
    assert [len(r) for r in split_layers(7, 3)] == [2, 3, 2]
    assert [len(r) for r in split_layers(5, 2)] == [2, 3]


def test_uneven_expert_split_front_loads_the_remainder() -> None:
    assert split_experts(6, 4) == [2, 2, 1, 1]
    assert split_experts(8, 4) == [2, 2, 2, 2]
