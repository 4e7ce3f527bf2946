// autoshard annotated IR: graph 'mlp' on mesh dp=2,tp=4 (shard dialect)
// mesh axes: 0 = dp (size 2), 1 = tp (size 4)
// every value is annotated as produced; annotate_for_users gives the sharding a consumer reads
// partial values: the shard dialect has no partial shardings, so a partial value is annotated with its split axes and its reduction rides on the shard op as autoshard.partial_axes (mesh axes) and autoshard.partial_type (kind); upstream passes ignore them
shard.grid @mesh(shape = 2x4)
func.func @mlp(%x: tensor<8x16xf32>, %w1: tensor<16x32xf32>, %w2: tensor<32x16xf32>) -> tensor<8x16xf32> {
  %sharding = shard.sharding @mesh split_axes = [[0]] : !shard.sharding
  %x_sharded = shard.shard %x to %sharding : tensor<8x16xf32>
  %sharding_1 = shard.sharding @mesh split_axes = [[], [1]] : !shard.sharding
  %w1_sharded = shard.shard %w1 to %sharding_1 : tensor<16x32xf32>
  %sharding_2 = shard.sharding @mesh split_axes = [[1]] : !shard.sharding
  %w2_sharded = shard.shard %w2 to %sharding_2 : tensor<32x16xf32>
  // op fc1 (matmul), option [[dp], [tp], []]
  %empty = tensor.empty() : tensor<8x32xf32>
  %cst = arith.constant 0.000000000e+00 : f32
  %init = linalg.fill ins(%cst : f32) outs(%empty : tensor<8x32xf32>) -> tensor<8x32xf32>
  %h = linalg.matmul ins(%x_sharded, %w1_sharded : tensor<8x16xf32>, tensor<16x32xf32>) outs(%init : tensor<8x32xf32>) -> tensor<8x32xf32>
  %sharding_3 = shard.sharding @mesh split_axes = [[0], [1]] : !shard.sharding
  %h_sharded = shard.shard %h to %sharding_3 : tensor<8x32xf32>
  // op act (gelu), option [[dp], [tp]]
  %empty_1 = tensor.empty() : tensor<8x32xf32>
  %a = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%h_sharded : tensor<8x32xf32>) outs(%empty_1 : tensor<8x32xf32>) {
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
  } -> tensor<8x32xf32>
  %a_sharded = shard.shard %a to %sharding_3 : tensor<8x32xf32>
  // op fc2 (matmul), option [[dp], [], [tp]]
  %empty_2 = tensor.empty() : tensor<8x16xf32>
  %cst_3 = arith.constant 0.000000000e+00 : f32
  %init_1 = linalg.fill ins(%cst_3 : f32) outs(%empty_2 : tensor<8x16xf32>) -> tensor<8x16xf32>
  %y = linalg.matmul ins(%a_sharded, %w2_sharded : tensor<8x32xf32>, tensor<32x16xf32>) outs(%init_1 : tensor<8x16xf32>) -> tensor<8x16xf32>
  %y_sharded = shard.shard %y to %sharding {autoshard.partial_axes = array<i16: 1>, autoshard.partial_type = #shard<partial sum>} : tensor<8x16xf32>
  %y_for_return = shard.shard %y_sharded to %sharding annotate_for_users : tensor<8x16xf32>
  return %y_for_return : tensor<8x16xf32>
}
