// One step of single-head attention over a small cache, the shape of the
// work a decoder does per token: softmax(q k^T / sqrt(d)) v.
// Bundled with mlxcel-host as its self-check program (`mlxcel-host demo`).
module @demo {
  func.func @attend(%q: tensor<1x4xf32>, %k: tensor<6x4xf32>, %v: tensor<6x4xf32>) -> tensor<1x4xf32> {
    %s0 = stablehlo.dot_general %q, %k, contracting_dims = [1] x [1] : (tensor<1x4xf32>, tensor<6x4xf32>) -> tensor<1x6xf32>
    %half = stablehlo.constant dense<0.5> : tensor<1x6xf32>
    %s = stablehlo.multiply %s0, %half : tensor<1x6xf32>
    %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %mx = stablehlo.reduce(%s init: %ninf) applies stablehlo.maximum across dimensions = [1] : (tensor<1x6xf32>, tensor<f32>) -> tensor<1xf32>
    %mxb = stablehlo.broadcast_in_dim %mx, dims = [0] : (tensor<1xf32>) -> tensor<1x6xf32>
    %d = stablehlo.subtract %s, %mxb : tensor<1x6xf32>
    %e = stablehlo.exponential %d : tensor<1x6xf32>
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %sum = stablehlo.reduce(%e init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<1x6xf32>, tensor<f32>) -> tensor<1xf32>
    %sumb = stablehlo.broadcast_in_dim %sum, dims = [0] : (tensor<1xf32>) -> tensor<1x6xf32>
    %p = stablehlo.divide %e, %sumb : tensor<1x6xf32>
    %o = stablehlo.dot_general %p, %v, contracting_dims = [1] x [0] : (tensor<1x6xf32>, tensor<6x4xf32>) -> tensor<1x4xf32>
    return %o : tensor<1x4xf32>
  }
}
