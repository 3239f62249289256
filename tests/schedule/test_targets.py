"""The target table: known names, the figures legality relies on, the unknown-target error."""

from __future__ import annotations

import dataclasses

import pytest

from emmy.errors import UserError
from emmy.schedule.targets import DEFAULT_TARGET, KIB, TARGETS, get_target


def test_known_targets_and_default():
    assert set(TARGETS) == {"sm_90a", "sm_80"}
    assert DEFAULT_TARGET == "sm_90a"
    assert all(get_target(name).name == name for name in TARGETS)


def test_h200_figures():
    t = get_target("sm_90a")
    assert t.arch_flag == "-arch=sm_90a" and t.compute_capability == (9, 0)
    assert t.sm_count == 132 and t.max_threads_per_block == 1024 and t.warp_size == 32
    assert t.shared_per_block_optin == 227 * KIB and t.shared_per_sm == 228 * KIB
    assert t.shared_reserved_per_block == 1 * KIB
    assert t.max_registers_per_thread == 255 and t.registers_per_sm == 65536
    assert t.dram_bytes_per_s == pytest.approx(4.8e12)
    assert t.has_wgmma and t.has_tma and t.has_cp_async and t.has_mma_sync


def test_a100_figures():
    t = get_target("sm_80")
    assert t.arch_flag == "-arch=sm_80" and t.sm_count == 108
    assert t.shared_per_block_optin == 163 * KIB and t.shared_per_sm == 164 * KIB
    assert t.dram_bytes_per_s == pytest.approx(2.0e12, rel=0.05)
    assert not t.has_wgmma and not t.has_tma and t.has_cp_async and t.has_ldmatrix


def test_limits_are_consistent():
    for t in TARGETS.values():
        assert t.max_warps_per_sm * t.warp_size == t.max_threads_per_sm
        assert t.shared_per_block_optin + t.shared_reserved_per_block <= t.shared_per_sm
        assert t.shared_per_block_static <= t.shared_per_block_optin
        assert t.bf16_tensor_flops >= t.tf32_tensor_flops > t.fp32_flops
        assert str(t) == t.name


def test_targets_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_target("sm_80").sm_count = 1  # type: ignore[misc]


def test_unknown_target_names_the_known_ones():
    with pytest.raises(UserError) as e:
        get_target("sm_90")
    assert "sm_90" in str(e.value) and "sm_90a" in str(e.value) and "sm_80" in str(e.value)
