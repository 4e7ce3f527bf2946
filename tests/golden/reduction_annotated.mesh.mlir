// autoshard annotated IR: graph 'reduction' on mesh x=2,y=2 (mesh dialect)
// mesh axes: 0 = x (size 2), 1 = y (size 2)
// every value is annotated as produced; annotate_for_users gives the sharding a consumer reads
mesh.mesh @mesh(shape = 2x2)
func.func @reduction(%x: tensor<8x12xf32>) -> (tensor<8xf32>, tensor<1x12xf32>, tensor<f32>) {
  %sharding = mesh.sharding @mesh split_axes = [[]] : !mesh.sharding
  %x_sharded = mesh.shard %x to %sharding : tensor<8x12xf32>
  // op rowsum (reduce_sum), option [[], [x]]
  %sharding_1 = mesh.sharding @mesh split_axes = [[], [0]] : !mesh.sharding
  %x_for_rowsum = mesh.shard %x_sharded to %sharding_1 annotate_for_users : tensor<8x12xf32>
  %empty = tensor.empty() : tensor<8xf32>
  %cst = arith.constant 0.000000000e+00 : f32
  %init = linalg.fill ins(%cst : f32) outs(%empty : tensor<8xf32>) -> tensor<8xf32>
  %s = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>], iterator_types = ["parallel", "reduction"]} ins(%x_for_rowsum : tensor<8x12xf32>) outs(%init : tensor<8xf32>) {
  ^bb0(%in: f32, %acc: f32):
    %addf = arith.addf %in, %acc : f32
    linalg.yield %addf : f32
  } -> tensor<8xf32>
  %sharding_2 = mesh.sharding @mesh split_axes = [[]] partial = sum[0] : !mesh.sharding
  %s_sharded = mesh.shard %s to %sharding_2 : tensor<8xf32>
  // op rowmax (reduce_max), option [[y], [x]]
  %sharding_3 = mesh.sharding @mesh split_axes = [[1], [0]] : !mesh.sharding
  %x_for_rowmax = mesh.shard %x_sharded to %sharding_3 annotate_for_users : tensor<8x12xf32>
  %empty_1 = tensor.empty() : tensor<8xf32>
  %cst_1 = arith.constant 0xFF800000 : f32
  %init_1 = linalg.fill ins(%cst_1 : f32) outs(%empty_1 : tensor<8xf32>) -> tensor<8xf32>
  %m = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>], iterator_types = ["parallel", "reduction"]} ins(%x_for_rowmax : tensor<8x12xf32>) outs(%init_1 : tensor<8xf32>) {
  ^bb0(%in_1: f32, %acc_1: f32):
    %maximumf = arith.maximumf %in_1, %acc_1 : f32
    linalg.yield %maximumf : f32
  } -> tensor<8xf32>
  %sharding_4 = mesh.sharding @mesh split_axes = [[1]] partial = max[0] : !mesh.sharding
  %m_sharded = mesh.shard %m to %sharding_4 : tensor<8xf32>
  // op colmean (reduce_mean), option [[], []]
  %empty_2 = tensor.empty() : tensor<1x12xf32>
  %cst_2 = arith.constant 0.000000000e+00 : f32
  %init_2 = linalg.fill ins(%cst_2 : f32) outs(%empty_2 : tensor<1x12xf32>) -> tensor<1x12xf32>
  %mean = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (0, d1)>], iterator_types = ["reduction", "parallel"]} ins(%x_sharded : tensor<8x12xf32>) outs(%init_2 : tensor<1x12xf32>) {
  ^bb0(%in_2: f32, %acc_2: f32):
    %addf_1 = arith.addf %in_2, %acc_2 : f32
    linalg.yield %addf_1 : f32
  } -> tensor<1x12xf32>
  %empty_3 = tensor.empty() : tensor<1x12xf32>
  %mean_1 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%mean : tensor<1x12xf32>) outs(%empty_3 : tensor<1x12xf32>) {
  ^bb0(%in_3: f32, %acc_3: f32):
    %count = arith.constant 8.000000000e+00 : f32
    %divf = arith.divf %in_3, %count : f32
    linalg.yield %divf : f32
  } -> tensor<1x12xf32>
  %mean_sharded = mesh.shard %mean_1 to %sharding : tensor<1x12xf32>
  // op all (reduce_sum), option [[y]]
  %sharding_5 = mesh.sharding @mesh split_axes = [[1]] : !mesh.sharding
  %s_for_all = mesh.shard %s_sharded to %sharding_5 annotate_for_users : tensor<8xf32>
  %empty_4 = tensor.empty() : tensor<f32>
  %cst_3 = arith.constant 0.000000000e+00 : f32
  %init_3 = linalg.fill ins(%cst_3 : f32) outs(%empty_4 : tensor<f32>) -> tensor<f32>
  %total = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> ()>], iterator_types = ["reduction"]} ins(%s_for_all : tensor<8xf32>) outs(%init_3 : tensor<f32>) {
  ^bb0(%in_4: f32, %acc_4: f32):
    %addf_2 = arith.addf %in_4, %acc_4 : f32
    linalg.yield %addf_2 : f32
  } -> tensor<f32>
  %sharding_6 = mesh.sharding @mesh split_axes = [[]] partial = sum[1] : !mesh.sharding
  %total_sharded = mesh.shard %total to %sharding_6 : tensor<f32>
  %m_for_return = mesh.shard %m_sharded to %sharding_5 annotate_for_users : tensor<8xf32>
  %total_for_return = mesh.shard %total_sharded to %sharding annotate_for_users : tensor<f32>
  return %m_for_return, %mean_sharded, %total_for_return : tensor<8xf32>, tensor<1x12xf32>, tensor<f32>
}
