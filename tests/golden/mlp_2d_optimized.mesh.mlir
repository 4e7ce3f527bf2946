// autoshard partitioned IR: graph 'mlp_2d_weight_stationary' on mesh a=2,b=2,c=2 (mesh dialect), as every device runs it
// mesh axes: 0 = a (size 2), 1 = b (size 2), 2 = c (size 2)
// arguments: each device's local shard
// local types: the largest shard per dim; ? where shards differ between devices
mesh.mesh @mesh(shape = 2x2x2)
func.func @mlp_2d_weight_stationary(%x: tensor<2x4x1xf32>, %w1: tensor<4x8xf32>, %w2: tensor<8x4xf32>) -> tensor<2x4x1xf32> {
  // x: [[], [], [a, b, c]] -> [[], [], [a]]
  %x_1 = mesh.all_gather %x on @mesh mesh_axes = [1, 2] gather_axis = 2 : tensor<2x4x1xf32> -> tensor<2x4x4xf32>
  // op fc1 (matmul), option [[], [], [b, c], [a]]: h [[], [], [b, c]] partial=sum[a]
  %empty = tensor.empty() : tensor<2x4x8xf32>
  %cst = arith.constant 0.000000000e+00 : f32
  %init = linalg.fill ins(%cst : f32) outs(%empty : tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %h = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>, affine_map<(d0, d1, d2, d3) -> (d3, d2)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%x_1, %w1 : tensor<2x4x4xf32>, tensor<4x8xf32>) outs(%init : tensor<2x4x8xf32>) {
  ^bb0(%in: f32, %in_1: f32, %acc: f32):
    %mulf = arith.mulf %in, %in_1 : f32
    %addf = arith.addf %acc, %mulf : f32
    linalg.yield %addf : f32
  } -> tensor<2x4x8xf32>
  // h: [[], [], [b, c]] partial=sum[a] -> [[], [], [b, c, a]]
  %h_1 = mesh.reduce_scatter %h on @mesh mesh_axes = [0] reduction = <sum> scatter_axis = 2 : tensor<2x4x8xf32> -> tensor<2x4x4xf32>
  // op relu (relu), option [[], [], [b, c, a]]: r [[], [], [b, c, a]]
  %empty_1 = tensor.empty() : tensor<2x4x4xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel"]} ins(%h_1 : tensor<2x4x4xf32>) outs(%empty_1 : tensor<2x4x4xf32>) {
  ^bb0(%in_2: f32, %acc_1: f32):
    %zero = arith.constant 0.000000000e+00 : f32
    %maximumf = arith.maximumf %in_2, %zero : f32
    linalg.yield %maximumf : f32
  } -> tensor<2x4x4xf32>
  // r: [[], [], [b, c, a]] -> [[], [], [b, c]]
  %r_1 = mesh.all_gather %r on @mesh mesh_axes = [0] gather_axis = 2 : tensor<2x4x4xf32> -> tensor<2x4x8xf32>
  // op fc2 (matmul), option [[], [], [a], [b, c]]: y [[], [], [a]] partial=sum[b, c]
  %empty_2 = tensor.empty() : tensor<2x4x4xf32>
  %cst_1 = arith.constant 0.000000000e+00 : f32
  %init_1 = linalg.fill ins(%cst_1 : f32) outs(%empty_2 : tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  %y = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>, affine_map<(d0, d1, d2, d3) -> (d3, d2)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%r_1, %w2 : tensor<2x4x8xf32>, tensor<8x4xf32>) outs(%init_1 : tensor<2x4x4xf32>) {
  ^bb0(%in_3: f32, %in_4: f32, %acc_2: f32):
    %mulf_1 = arith.mulf %in_3, %in_4 : f32
    %addf_1 = arith.addf %acc_2, %mulf_1 : f32
    linalg.yield %addf_1 : f32
  } -> tensor<2x4x4xf32>
  // y: [[], [], [a]] partial=sum[b, c] -> [[], [], [a, b, c]]
  %y_1 = mesh.reduce_scatter %y on @mesh mesh_axes = [1, 2] reduction = <sum> scatter_axis = 2 : tensor<2x4x4xf32> -> tensor<2x4x1xf32>
  return %y_1 : tensor<2x4x1xf32>
}
