// A checkpoint tensor as an IREE parameter: scales a row by the final norm
// weight of a 64-wide checkpoint (the bundled tests/fixtures/qwen2), the
// multiply an RMSNorm ends with. Run it with
//   tools/run.sh run docs/examples/norm_scale.mlir --input "1x64xf32=$(seq -s ' ' 64)" --params tests/fixtures/qwen2
module @example {
  util.global private @norm = #flow.parameter.named<"model"::"model.norm.weight"> : tensor<64xf32>
  func.func @scale(%x: tensor<1x64xf32>) -> tensor<1x64xf32> {
    %w = util.global.load @norm : tensor<64xf32>
    %wb = stablehlo.broadcast_in_dim %w, dims = [1] : (tensor<64xf32>) -> tensor<1x64xf32>
    %y = stablehlo.multiply %x, %wb : tensor<1x64xf32>
    return %y : tensor<1x64xf32>
  }
}
