// Matchers for 512-bit (AVX-512) llvm-cpu targets only, composed into the llvm-cpu spec
// (`shim/src/compiler.rs`, `llvm_cpu_tuning_spec`) ahead of every target's, so that where both
// match, these win.
//
// A decode step of several rows over an affine-quantized weight in row tiles, as
// `match_qlinear_tiled_rows` (every target's) matches it: 8 rows by 16 outputs per vector step
// instead of 8 by 8, so each step dequantizes one full 512-bit vector of a tile's outputs for an
// input and multiplies it into 8 rows' accumulators (8 by 8 takes half-width vectors here; on
// AVX2, 8 rows by 16 outputs would need 16 accumulators, every register the target has). Each
// output still sums its products over a group's inputs in order, so the results are the same.
// An 8960x1536 4-bit weight in groups of 64, tiles of 32, 8 rows, on an AMD Zen 4 (2 threads,
// the dispatch alone, medians of 5, two rounds): 2.46 and 2.53 ms against 3.53 and 3.85.
  transform.named_sequence @match_qlinear_tiled_rows_avx512(%op: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %ins, %outs = transform.iree.match.cast_compatible_dag_from_root %op {
    ^bb0(%x: tensor<?x?x?xf32>, %w: tensor<?x?x?x?xf32>, %o: tensor<?x?x?x?xf32>):
      %r = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3, d4) -> (d0, d2, d4)>, affine_map<(d0, d1, d2, d3, d4) -> (d1, d2, d4, d3)>, affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]} ins(%x, %w : tensor<?x?x?xf32>, tensor<?x?x?x?xf32>) outs(%o : tensor<?x?x?x?xf32>) {
      ^bb1(%a: f32, %b: f32, %acc: f32):
        %p = arith.mulf %a, %b : f32
        %s = arith.addf %acc, %p : f32
        linalg.yield %s : f32
      } -> tensor<?x?x?x?xf32>
    } : (!transform.any_op) -> (!transform.any_value, !transform.any_value)
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_cpu.lowering_config<distribution = [8, 8, 0, 0, 0], vector_common_parallel = [8, 1, 1, 16, 0], vector_reduction = [0, 0, 0, 0, 1]>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>>> -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }
