// autoshard partitioned IR: graph 'attention' on mesh x=2,y=2 (shard dialect), as every device runs it
// mesh axes: 0 = x (size 2), 1 = y (size 2)
// arguments: each device's local shard
// local types: the largest shard per dim; ? where shards differ between devices
shard.grid @mesh(shape = 2x2)
func.func @attention(%q: tensor<2x2x4x8xf32>, %k: tensor<2x2x6x8xf32>, %v: tensor<2x2x6x4xf32>) -> tensor<1x2x2x4xf32> {
  // q: [] -> [[x]]
  %q_1 = shard.all_slice %q on @mesh grid_axes = [0] slice_axis = 0 : tensor<2x2x4x8xf32> -> tensor<1x2x4x8xf32>
  // q: [[x]] -> [[x], [], [y]]
  %q_2 = shard.all_slice %q_1 on @mesh grid_axes = [1] slice_axis = 2 : tensor<1x2x4x8xf32> -> tensor<1x2x2x8xf32>
  // k: [] -> [[x]]
  %k_1 = shard.all_slice %k on @mesh grid_axes = [0] slice_axis = 0 : tensor<2x2x6x8xf32> -> tensor<1x2x6x8xf32>
  // v: [] -> [[x]]
  %v_1 = shard.all_slice %v on @mesh grid_axes = [0] slice_axis = 0 : tensor<2x2x6x4xf32> -> tensor<1x2x6x4xf32>
  // op sdpa (attention), option [[x], [], [y], [], [], []]: o [[x], [], [y]]
  %device:2 = shard.process_multi_index on @mesh axes = [0, 1] : index, index
  %c2 = arith.constant 2 : index
  %start = arith.muli %device#1, %c2 : index
  %c4 = arith.constant 4 : index
  %start_1 = arith.minui %start, %c4 : index
  %empty = tensor.empty() : tensor<1x2x2x6xf32>
  %cst = arith.constant 0.000000000e+00 : f32
  %init = linalg.fill ins(%cst : f32) outs(%empty : tensor<1x2x2x6xf32>) -> tensor<1x2x2x6xf32>
  %scores = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d4)>, affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d3, d4)>, affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]} ins(%q_2, %k_1 : tensor<1x2x2x8xf32>, tensor<1x2x6x8xf32>) outs(%init : tensor<1x2x2x6xf32>) {
  ^bb0(%in: f32, %in_1: f32, %acc: f32):
    %mulf = arith.mulf %in, %in_1 : f32
    %addf = arith.addf %acc, %mulf : f32
    linalg.yield %addf : f32
  } -> tensor<1x2x2x6xf32>
  %empty_1 = tensor.empty() : tensor<1x2x2x6xf32>
  %logits = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%scores : tensor<1x2x2x6xf32>) outs(%empty_1 : tensor<1x2x2x6xf32>) {
  ^bb0(%in_2: f32, %acc_1: f32):
    %scale = arith.constant 3.535533845e-01 : f32
    %mulf_1 = arith.mulf %in_2, %scale : f32
    %i2 = linalg.index 2 : index
    %g2 = arith.addi %i2, %start_1 : index
    %i3 = linalg.index 3 : index
    %seen = arith.cmpi ule, %i3, %g2 : index
    %ninf = arith.constant 0xFF800000 : f32
    %masked = arith.select %seen, %mulf_1, %ninf : f32
    linalg.yield %masked : f32
  } -> tensor<1x2x2x6xf32>
  %empty_2 = tensor.empty() : tensor<1x2x2x6xf32>
  %weights = linalg.softmax dimension(3) ins(%logits : tensor<1x2x2x6xf32>) outs(%empty_2 : tensor<1x2x2x6xf32>) -> tensor<1x2x2x6xf32>
  %empty_3 = tensor.empty() : tensor<1x2x2x4xf32>
  %cst_1 = arith.constant 0.000000000e+00 : f32
  %init_1 = linalg.fill ins(%cst_1 : f32) outs(%empty_3 : tensor<1x2x2x4xf32>) -> tensor<1x2x2x4xf32>
  %o = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d4)>, affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d4, d3)>, affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]} ins(%weights, %v_1 : tensor<1x2x2x6xf32>, tensor<1x2x6x4xf32>) outs(%init_1 : tensor<1x2x2x4xf32>) {
  ^bb0(%in_3: f32, %in_4: f32, %acc_2: f32):
    %mulf_2 = arith.mulf %in_3, %in_4 : f32
    %addf_1 = arith.addf %acc_2, %mulf_2 : f32
    linalg.yield %addf_1 : f32
  } -> tensor<1x2x2x4xf32>
  return %o : tensor<1x2x2x4xf32>
}
