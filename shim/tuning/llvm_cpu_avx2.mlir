// Matchers for 256-bit (AVX2) llvm-cpu targets only, composed into the llvm-cpu spec
// (`shim/src/compiler.rs`, `llvm_cpu_tuning_spec`). IREE's AVX-512 defaults for these shapes
// differ (16 rows by 16 outputs per vector step), so they are not given to other targets.
//
// An f32 weight in row tiles (`NumericContract::linear_tiled`) contracted over 4096 inputs or
// more against 16-row tiles of x (a prefill chunk, an encoder's patches). IREE 3.13's default
// gives each workgroup a single 16x16 (or 16x8) output tile once the depth passes about 3000, so
// every workgroup streams a whole x tile and a whole weight tile for 256 (128) outputs and
// reuses neither. Four x tiles by four weight tiles per workgroup, the vector steps unchanged
// (each output still sums its inputs in order, so the results are the same), measured on an
// AMD Zen 3 (2 threads, `linalg.mmt4d` alone, medians of runs alternated 4 or 5 times): a
// 1536x8960 weight against 64 rows 14.2 against 18.8 ms, a 1280x5120 weight against 1024 rows
// 101 against 139 ms; at 2048 and 3072 inputs level, so IREE's default is kept there.
  transform.named_sequence @match_mmt4d_f32_deep_tiles8(%op: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %ins, %outs = transform.iree.match.cast_compatible_dag_from_root %op {
    ^bb0(%x: tensor<?x?x16x1xf32>, %w: tensor<?x?x8x1xf32>, %o: tensor<?x?x16x8xf32>):
      %r = linalg.mmt4d ins(%x, %w : tensor<?x?x16x1xf32>, tensor<?x?x8x1xf32>) outs(%o : tensor<?x?x16x8xf32>) -> tensor<?x?x16x8xf32>
    } : (!transform.any_op) -> (!transform.any_value, !transform.any_value)
    %x = transform.get_operand %op[0] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.dim_bounds %x[1], umin = 4096, none : !transform.any_value
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_cpu.lowering_config<distribution = [4, 4, 0, 0, 0, 0], vector_common_parallel = [1, 1, 0, 8, 8, 0], vector_reduction = [0, 0, 1, 0, 0, 1]>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<Mmt4dTilingExpert>>> -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  // The same for weights in tiles of 16 rows (an encoder's f32 weights on AVX2).
  transform.named_sequence @match_mmt4d_f32_deep_tiles16(%op: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %ins, %outs = transform.iree.match.cast_compatible_dag_from_root %op {
    ^bb0(%x: tensor<?x?x16x1xf32>, %w: tensor<?x?x16x1xf32>, %o: tensor<?x?x16x16xf32>):
      %r = linalg.mmt4d ins(%x, %w : tensor<?x?x16x1xf32>, tensor<?x?x16x1xf32>) outs(%o : tensor<?x?x16x16xf32>) -> tensor<?x?x16x16xf32>
    } : (!transform.any_op) -> (!transform.any_value, !transform.any_value)
    %x = transform.get_operand %op[0] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.dim_bounds %x[1], umin = 4096, none : !transform.any_value
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_cpu.lowering_config<distribution = [4, 4, 0, 0, 0, 0], vector_common_parallel = [1, 1, 0, 4, 16, 0], vector_reduction = [0, 0, 1, 0, 0, 1]>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<Mmt4dTilingExpert>>> -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }
