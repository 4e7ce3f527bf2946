"""Reading collectives out of compiled HLO text (no jax needed): the opcode whatever the
instruction's name, tuple results, the three spellings of device groups, bytes per device counted
as the plan counts them, and XLA:CPU's all-reduce + slice read as the reduce-scatter it is."""

from __future__ import annotations

from autoshard.frontends.jax.hlo import compiled_collectives

HLO = """\
HloModule jit_body, entry_computation_layout={(f32[8,16]{1,0})->f32[16,64]{1,0}}

ENTRY %main.1 (param.1: f32[8,64], param.2: f32[16,64]) -> f32[16,64] {
  %param.1 = f32[8,64]{1,0} parameter(0)
  %all-gather = f32[16,64]{1,0} all-gather(%param.1), channel_id=1, replica_groups=mesh['axis_0'=2,'axis_1'=1,'axis_2'=4] {'axis_0'}, dimensions={0}, use_global_device_ids=true
  %dot_general.9 = f32[16,64]{1,0} all-reduce(%all-gather), channel_id=2, replica_groups=mesh['axis_0'=1,'axis_1'=4,'axis_2'=2], device_ids=([2,4]T(1,0)) {'axis_1'}, use_global_device_ids=true, to_apply=%add.clone
  %all-reduce.1 = f32[16,64]{1,0} all-reduce(%dot_general.9), channel_id=3, replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, to_apply=%add.clone
  %dynamic-slice_fusion = f32[4,64]{1,0} fusion(%all-reduce.1, %partition-id), kind=kLoop, calls=%fused_dynamic-slice
  %all-to-all.1 = (f32[4,1,8]{2,1,0}, f32[4,1,8]{2,1,0}, f32[4,1,8]{2,1,0}, f32[4,1,8]{2,1,0}) all-to-all(%a, %b, %c, %d), channel_id=4, replica_groups=[2,4]<=[8]
  %collective-permute = bf16[4,64]{1,0} collective-permute(%dynamic-slice_fusion), channel_id=5, source_target_pairs={{0,1},{1,0}}
  ROOT %tuple = (f32[16,64]{1,0}) tuple(%dot_general.9)
}
"""


def test_every_collective_is_read_with_its_group_and_bytes_per_device():
    found = [(c.kind, c.group_size, c.bytes_per_device) for c in compiled_collectives(HLO)]
    assert found == [
        ("all-gather", 2, 16 * 64 * 4 // 2),  # the input buffer: the result over the group
        ("all-reduce", 4, 16 * 64 * 4),  # named like a dot, permuted devices
        ("reduce-scatter", 4, 16 * 64 * 4),  # an all-reduce whose only user keeps a quarter
        ("all-to-all", 4, 4 * (4 * 8 * 4)),  # four tuple parts
        ("collective-permute", 2, 4 * 64 * 2),  # bf16
    ]


COMBINED = """\
ENTRY %main.2 (p.1: f32[1,2,32,16], p.2: f32[1,2,16,32]) -> (f32[1,2,8,16], f32[1,2,16,32]) {
  %all-reduce.2 = (f32[1,2,32,16]{3,2,1,0}, f32[1,2,16,32]{3,2,1,0}) all-reduce(%p.1, %p.2), replica_groups=[2,4]<=[8]
  %get-tuple-element.3 = f32[1,2,32,16]{3,2,1,0} get-tuple-element(%all-reduce.2), index=0
  %get-tuple-element.4 = f32[1,2,16,32]{3,2,1,0} get-tuple-element(%all-reduce.2), index=1
  %dynamic-slice_transpose_fusion.1 = f32[1,8,2,16]{3,1,2,0} fusion(%get-tuple-element.3, %partition-id)
  ROOT %tuple = (f32[1,8,2,16], f32[1,2,16,32]) tuple(%dynamic-slice_transpose_fusion.1, %get-tuple-element.4)
}
"""


def test_a_combined_all_reduce_is_read_as_the_collectives_it_merged():
    """XLA's combiner merges independent all-reduces into one of a tuple: each part is the
    collective it was, a reduce-scatter where only a device's part of it is kept."""
    found = [(c.kind, c.group_size, c.bytes_per_device) for c in compiled_collectives(COMBINED)]
    assert found == [("reduce-scatter", 4, 2 * 32 * 16 * 4), ("all-reduce", 4, 2 * 16 * 32 * 4)]
