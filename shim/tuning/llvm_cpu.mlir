// IREE tuning spec for the llvm-cpu target, given to every CPU compile with
// --iree-codegen-tuning-spec-path; its digest is part of the target's fingerprint,
// so a change here recompiles every cached module.
//
// Each matcher names the dispatch shape IREE 3.13's default configuration leaves
// slow, and the configuration measured faster on this project's bench machines
// (BENCHMARKS.md, "the bf16 decode step").
module @mlxcel_llvm_cpu attributes {transform.with_named_sequence, iree_codegen.tuning_spec_with_default_entrypoint} {
  transform.named_sequence @apply_op_config(%op: !transform.any_op {transform.readonly}, %config: !transform.any_param {transform.readonly}) {
    transform.annotate %op "compilation_info" = %config : !transform.any_op, !transform.any_param
    transform.yield
  }

  // A decode step's linear over a 16-bit float weight (`w @ x`, one row, f32
  // activations) that is not served in row tiles (the graphs tile every matrix
  // whose rows fill tiles of 32; see `NumericContract::linear_tiled`). IREE's default vectorises 32 output rows by 16 inputs, which
  // widens and transposes every weight tile: an 8960x1536 bf16 weight took 4.5 ms
  // (6 GB/s), the 151936x1536 head 44 ms. One output row by 256 inputs streams
  // each weight row: 1.2 ms and 12 ms. The 256 lanes are summed apart and
  // combined at the end, which needs --iree-llvmcpu-reassociate-fp-reductions
  // (the decoder bundle sets it whenever it reads 16-bit weights; without it
  // the lanes are reduced one by one and the step is slower than the default).
  transform.named_sequence @match_matvec_bf16(%op: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %ins, %outs = transform.iree.match.cast_compatible_dag_from_root %op {
    ^bb0(%w: tensor<?x?xbf16>, %x: tensor<?xf32>, %o: tensor<?xf32>):
      %r = linalg.matvec ins(%w, %x : tensor<?x?xbf16>, tensor<?xf32>) outs(%o : tensor<?xf32>) -> tensor<?xf32>
    } : (!transform.any_op) -> (!transform.any_value, !transform.any_value)
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_cpu.lowering_config<distribution = [64, 0], vector_common_parallel = [1, 0], vector_reduction = [0, 256]>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>, {enable_loop_peeling}>> -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  // The same for f16 weights.
  transform.named_sequence @match_matvec_f16(%op: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %ins, %outs = transform.iree.match.cast_compatible_dag_from_root %op {
    ^bb0(%w: tensor<?x?xf16>, %x: tensor<?xf32>, %o: tensor<?xf32>):
      %r = linalg.matvec ins(%w, %x : tensor<?x?xf16>, tensor<?xf32>) outs(%o : tensor<?xf32>) -> tensor<?xf32>
    } : (!transform.any_op) -> (!transform.any_value, !transform.any_value)
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_cpu.lowering_config<distribution = [64, 0], vector_common_parallel = [1, 0], vector_reduction = [0, 256]>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>, {enable_loop_peeling}>> -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  transform.named_sequence @__kernel_config(%variant: !transform.any_op {transform.consumed}) -> !transform.any_op attributes {iree_codegen.tuning_spec_entrypoint} {
    %res = transform.foreach_match in %variant
        @match_matvec_bf16 -> @apply_op_config,
        @match_matvec_f16 -> @apply_op_config
      : (!transform.any_op) -> !transform.any_op
    transform.yield %res : !transform.any_op
  }
}
