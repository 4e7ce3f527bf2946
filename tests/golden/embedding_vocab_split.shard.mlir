// autoshard partitioned IR: graph 'embedding' on mesh x=2,y=2 (shard dialect), as every device runs it
// mesh axes: 0 = x (size 2), 1 = y (size 2)
// arguments: each device's local shard
// local types: the largest shard per dim; ? where shards differ between devices
shard.grid @mesh(shape = 2x2)
func.func @embedding(%ids: tensor<2x6xi32>, %table: tensor<8x8xf32>) -> tensor<2x6x8xf32> {
  // op lookup (embedding), option [[x], [], [], [y]]: e [[x]] partial=sum[y]
  %device:2 = shard.process_multi_index on @mesh axes = [0, 1] : index, index
  %c8 = arith.constant 8 : index
  %start = arith.muli %device#1, %c8 : index
  %c16 = arith.constant 16 : index
  %start_1 = arith.minui %start, %c16 : index
  %empty = tensor.empty() : tensor<2x6x8xf32>
  %cst = arith.constant 0.000000000e+00 : f32
  %init = linalg.fill ins(%cst : f32) outs(%empty : tensor<2x6x8xf32>) -> tensor<2x6x8xf32>
  %e = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1)>, affine_map<(d0, d1, d2, d3) -> (d3, d2)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%ids, %table : tensor<2x6xi32>, tensor<8x8xf32>) outs(%init : tensor<2x6x8xf32>) {
  ^bb0(%in: i32, %in_1: f32, %acc: f32):
    %row = arith.index_cast %in : i32 to index
    %i3 = linalg.index 3 : index
    %g3 = arith.addi %i3, %start_1 : index
    %hit = arith.cmpi eq, %row, %g3 : index
    %zero = arith.constant 0.000000000e+00 : f32
    %picked = arith.select %hit, %in_1, %zero : f32
    %addf = arith.addf %acc, %picked : f32
    linalg.yield %addf : f32
  } -> tensor<2x6x8xf32>
  // e: [[x]] partial=sum[y] -> [[x]]
  %e_1 = shard.all_reduce %e on @mesh grid_axes = [1] reduction = sum : tensor<2x6x8xf32> -> tensor<2x6x8xf32>
  return %e_1 : tensor<2x6x8xf32>
}
