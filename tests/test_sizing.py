"""Sizing against the model's published size (1.56 TB) and the FSx for Lustre capacity steps."""

from __future__ import annotations

import pytest

from components.core import fsx
from components.core.config import namespace_config, read_stack_config
from components.core.fsx import fsx_capacity_gib, fsx_read_bytes_per_second
from components.core.kv_layout import model_layout
from components.core.load import load_stack, parse_spec
from components.core.model import KIMI_K3_1_PRO
from components.core.sizing import (
    STORAGE_HEADROOM_FRACTION,
    compute_sizing,
    copy_memory_budget,
    download_seconds,
    kv_cache_token_range,
    startup_budget_seconds,
)
from components.core.targets import GPUS
from components.core.versions import RECIPE_ENGINE_READY_TIMEOUT_S
from tests.conftest import FIXED_NOW, STACKS

WEIGHTS = KIMI_K3_1_PRO.weights_bytes


def within(value: float, expected: float, fraction: float) -> bool:
    return abs(value - expected) <= expected * fraction


def test_weights_are_1453_gib():
    assert round(WEIGHTS / 2**30) == 1453


def test_fsx_smallest_valid_size_is_2400_gib():
    assert fsx_capacity_gib(WEIGHTS, headroom_fraction=STORAGE_HEADROOM_FRACTION) == 2400  # the default 10 %
    assert fsx_capacity_gib(WEIGHTS, headroom_fraction=0.0) == 2400


@pytest.mark.parametrize("needed,expected", [(1, 1200), (1200, 1200), (1201, 2400), (2400, 2400), (2401, 4800), (7000, 7200)])
def test_fsx_round_up(needed, expected):
    assert fsx.round_up_capacity_gib(needed) == expected
    assert fsx.is_valid_capacity_gib(expected)


@pytest.mark.parametrize("bad", [1560, 3600, 0, 1000])
def test_fsx_invalid_sizes(bad):
    assert not fsx.is_valid_capacity_gib(bad)


def test_fsx_read_time_matches_design():
    fast = fsx_read_bytes_per_second(2400, 1000)
    slow = fsx_read_bytes_per_second(2400, 125)
    assert within(fast, 2.4e9, 0.05)
    assert within(WEIGHTS / fast / 60, 11, 0.05)  # about 11 minutes
    assert within(WEIGHTS / slow / 60, 89, 0.02)  # about 89 minutes


def _tokens(gpu, utilization, dtype, dcp=1, argv=()):
    layout = model_layout(KIMI_K3_1_PRO, dtype, gpu, argv=argv)
    budget = copy_memory_budget(KIMI_K3_1_PRO, gpu, 8, dcp, layout, argv=argv, gpu_memory_utilization=utilization)
    return kv_cache_token_range(budget, layout, dcp)


def test_kv_tokens_b300_tp8_and_dcp8():
    """8x B300, FP8 KV, utilization unset (1.0), no backend named: 16,992 B per token (24 x (576 B
    FlashInfer latent + 132 B indexer key)) in what the named terms leave: above the 2.41M the fitted
    0.95 reserve gave at the low end; DCP8 shards both caches but pays a larger workspace and indexer
    buffer, so it holds less than 8x."""
    b300 = GPUS["B300"]
    tp = _tokens(b300, None, "fp8")
    dcp = _tokens(b300, None, "fp8", 8, ("--attention-backend", "FLASHINFER_MLA_SPARSE"))
    assert 2_411_742 < tp[0] < tp[1], tp
    assert 6 * tp[0] < dcp[0] < 8 * tp[0] and dcp[0] < dcp[1], (tp, dcp)


def test_kv_tokens_shrink_with_bf16_and_lower_utilization():
    b300 = GPUS["B300"]
    fp8 = _tokens(b300, None, "fp8")
    bf16 = _tokens(b300, None, "auto")
    low = _tokens(b300, 0.90, "fp8")
    assert bf16[0] < fp8[0] and low[0] < fp8[0] and low[1] < fp8[1]


def test_download_takes_over_four_hours_at_100_mbps():
    seconds = download_seconds(WEIGHTS, 100e6)
    assert seconds == 15_600
    assert seconds > 4 * 3600
    with pytest.raises(ValueError):
        download_seconds(WEIGHTS, 0)


def test_the_plan_times_the_hub_download_with_the_same_function():
    """The plan's two download figures are ``download_seconds`` at the hub range's two ends, rounded up."""
    from components.core.time_inputs import publish_hub_rate
    spec = load_stack("b300", now=FIXED_NOW)
    sizing = compute_sizing(spec)
    hub = publish_hub_rate(spec, staging=False)
    assert sizing.download_seconds == download_seconds(WEIGHTS, hub.expected.bytes_per_second)
    assert sizing.download_seconds_slow == download_seconds(WEIGHTS, hub.low.bytes_per_second)
    assert sizing.download_seconds_slow > sizing.download_seconds


def test_startup_budget_never_below_recipe_and_grows_with_load():
    assert startup_budget_seconds(10) == RECIPE_ENGINE_READY_TIMEOUT_S
    slow = startup_budget_seconds(5_340)  # FSx at 125 MB/s/TiB
    assert slow >= 2 * 5_340 and slow % 60 == 0


@pytest.mark.parametrize("name", STACKS)
def test_every_timeout_covers_the_load(name):
    sizing = compute_sizing(load_stack(name, now=FIXED_NOW))
    assert sizing.startup_budget_seconds >= max(RECIPE_ENGINE_READY_TIMEOUT_S, sizing.load_seconds)
    assert sizing.storage.capacity_gib is None or sizing.storage.capacity_gib >= sizing.storage.needed_gib


def test_fsx_serving_load_time_and_budget():
    ns, _ = namespace_config(read_stack_config("b300-prod"))
    ns["storage"] = {"kind": "fsx", "fsx": {"throughputPerTib": 125}}
    ns["compute"] = {**ns["compute"], "replicas": 1}  # one node reads the file system
    sizing = compute_sizing(parse_spec(ns, stack="t", now=FIXED_NOW))
    assert sizing.storage.fsx_capacity_gib == 2400
    assert within(sizing.load_seconds / 60, 89, 0.02)
    assert sizing.startup_budget_seconds > sizing.load_seconds * 2


def test_gpu_memory_utilization_too_low_is_a_config_error():
    from components.core.errors import ConfigError

    ns, _ = namespace_config(read_stack_config("b300"))
    ns["vllm"] = {**ns["vllm"], "gpuMemoryUtilization": 0.7}
    with pytest.raises(ConfigError) as info:
        compute_sizing(parse_spec(ns, stack="t", now=FIXED_NOW))
    assert str(info.value).startswith("kimi-deploy:vllm.gpuMemoryUtilization: 0.7")


def test_price_b300_on_demand_and_unknown_gb300():
    b300 = compute_sizing(load_stack("b300", now=FIXED_NOW))
    assert b300.usd_per_hour == pytest.approx(142.416)
    gb300 = compute_sizing(load_stack("gb300", now=FIXED_NOW))
    assert gb300.usd_per_hour is None and "compute.capacity.usdPerHour" in gb300.price_source
    prod = compute_sizing(load_stack("b300-prod", now=FIXED_NOW))
    assert prod.usd_per_hour == pytest.approx(2 * 142.416)


def test_sync_times_and_first_deploy():
    from components.core.sizing import SYNC_BUDGET_FLOOR_SECONDS, sync_budget_seconds, sync_expected_seconds
    from components.core.time_inputs import mirror_copy_rate
    from components.core.time_to_ready import first_deploy_seconds
    from components.core.weights import sync_steps

    spec = load_stack("b300", now=FIXED_NOW)
    sizing = compute_sizing(spec)
    publish, copy = sync_steps(spec, "bucket")
    assert sync_expected_seconds(spec, sizing, publish) == 962  # the hub at its measured 1.62 GB/s
    assert sync_expected_seconds(spec, sizing, publish, slow=True) == 3_120  # its slow end, 0.5 GB/s
    rate = mirror_copy_rate(spec).bytes_per_second
    assert sync_expected_seconds(spec, sizing, copy) == -(-WEIGHTS // int(rate))
    assert sync_budget_seconds(spec, sizing, publish) == 6_240  # 2 x the slow end
    # The copy's budget derives from the model with the safety factor, never below the floor.
    assert sync_budget_seconds(spec, sizing, copy) == max(
        SYNC_BUDGET_FLOOR_SECONDS, -(-2 * sync_expected_seconds(spec, sizing, copy) // 60) * 60
    )
    total = first_deploy_seconds(spec, sizing, (publish, copy))
    assert total > 962 + sync_expected_seconds(spec, sizing, copy) + sizing.load_seconds
    assert total < 3600  # the measured hub rate: under an hour, not the 4.8 h of the 100 MB/s guess


def test_fsx_node_copy_shares_the_file_system():
    from components.core.sizing import sync_expected_seconds
    from components.core.weights import sync_steps

    ns, _ = namespace_config(read_stack_config("b300-prod"))
    ns["storage"] = {**ns["storage"], "kind": "nvme-from-fsx"}  # FSx is an opt-in (b300-prod copies from the mirror)
    spec = parse_spec(ns, stack="t", now=FIXED_NOW)
    sizing = compute_sizing(spec)
    copy = sync_steps(spec, "bucket")[-1]
    assert copy.needs_fsx
    per_node = sizing.storage.fsx_read_bytes_per_second // spec.gpu_nodes
    assert sync_expected_seconds(spec, sizing, copy) == -(-WEIGHTS // per_node)
