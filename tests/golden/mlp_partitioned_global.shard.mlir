// autoshard partitioned IR: graph 'mlp' on mesh dp=2,tp=4 (shard dialect), as every device runs it
// mesh axes: 0 = dp (size 2), 1 = tp (size 4)
// arguments: full tensors, each device cutting its shard
// local types: the largest shard per dim; ? where shards differ between devices
shard.grid @mesh(shape = 2x4)
func.func @mlp(%x: tensor<8x16xf32>, %w1: tensor<16x32xf32>, %w2: tensor<32x16xf32>) -> tensor<4x16xf32> {
  %x_local = shard.all_slice %x on @mesh grid_axes = [0] slice_axis = 0 : tensor<8x16xf32> -> tensor<4x16xf32>
  %w1_local = shard.all_slice %w1 on @mesh grid_axes = [1] slice_axis = 1 : tensor<16x32xf32> -> tensor<16x8xf32>
  %w2_local = shard.all_slice %w2 on @mesh grid_axes = [1] slice_axis = 0 : tensor<32x16xf32> -> tensor<8x16xf32>
  // op fc1 (matmul), option [[dp], [tp], []]: h [[dp], [tp]]
  %empty = tensor.empty() : tensor<4x8xf32>
  %cst = arith.constant 0.000000000e+00 : f32
  %init = linalg.fill ins(%cst : f32) outs(%empty : tensor<4x8xf32>) -> tensor<4x8xf32>
  %h = linalg.matmul ins(%x_local, %w1_local : tensor<4x16xf32>, tensor<16x8xf32>) outs(%init : tensor<4x8xf32>) -> tensor<4x8xf32>
  // op act (gelu), option [[dp], [tp]]: a [[dp], [tp]]
  %empty_1 = tensor.empty() : tensor<4x8xf32>
  %a = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%h : tensor<4x8xf32>) outs(%empty_1 : tensor<4x8xf32>) {
  ^bb0(%in: f32, %acc: f32):
    %x2 = arith.mulf %in, %in : f32
    %x3 = arith.mulf %x2, %in : f32
    %cst_1 = arith.constant 4.471499845e-02 : f32
    %t = arith.mulf %cst_1, %x3 : f32
    %inner = arith.addf %in, %t : f32
    %cst_2 = arith.constant 7.978845835e-01 : f32
    %t_1 = arith.mulf %cst_2, %inner : f32
    %tanh = math.tanh %t_1 : f32
    %one = arith.constant 1.000000000e+00 : f32
    %half = arith.constant 5.000000000e-01 : f32
    %hx = arith.mulf %half, %in : f32
    %t_2 = arith.addf %one, %tanh : f32
    %gelu = arith.mulf %hx, %t_2 : f32
    linalg.yield %gelu : f32
  } -> tensor<4x8xf32>
  // op fc2 (matmul), option [[dp], [], [tp]]: y [[dp]] partial=sum[tp]
  %empty_2 = tensor.empty() : tensor<4x16xf32>
  %cst_3 = arith.constant 0.000000000e+00 : f32
  %init_1 = linalg.fill ins(%cst_3 : f32) outs(%empty_2 : tensor<4x16xf32>) -> tensor<4x16xf32>
  %y = linalg.matmul ins(%a, %w2_local : tensor<4x8xf32>, tensor<8x16xf32>) outs(%init_1 : tensor<4x16xf32>) -> tensor<4x16xf32>
  // y: [[dp]] partial=sum[tp] -> [[dp]]
  %y_1 = shard.all_reduce %y on @mesh grid_axes = [1] reduction = sum : tensor<4x16xf32> -> tensor<4x16xf32>
  return %y_1 : tensor<4x16xf32>
}
