// Matchers of the IREE tuning spec for every llvm-cpu target, composed with those of the
// target's vector width (`llvm_cpu_avx2.mlir`) into one spec given to every CPU compile with
// --iree-codegen-tuning-spec-path (`shim/src/compiler.rs`, `llvm_cpu_tuning_spec`, which adds
// the module, `@apply_op_config` and the entry point trying each matcher in turn); its digest
// is part of the target's fingerprint, so a change here recompiles every cached module.
//
// Each matcher names the dispatch shape IREE 3.13's default configuration leaves
// slow, and the configuration measured faster on this project's bench machines
// (BENCHMARKS.md, "the bf16 decode step").

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

  // A decode step of several streams over an affine-quantized weight (`NumericContract::qlinear`,
  // up to 8 rows): x [rows, groups, group_size] against the weight dequantized in f32
  // [out, groups, group_size] (fused into this dispatch as its producer), reduced over both.
  // IREE's default vectorises one row by one output, so each row dequantizes the weight again
  // (8 rows of an 8960x1536 4-bit weight in groups of 64: 7.0 ms); 8 rows by one output by 64
  // inputs dequantizes each weight vector once for all of them: 4.2 to 4.6 ms (3 rows 2.2 ms,
  // one row unchanged at 1.1). Groups of 32 take 32 inputs at a time (6.3 against 5.0 ms).
  transform.named_sequence @match_qlinear_rows_g32(%op: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %ins, %outs = transform.iree.match.cast_compatible_dag_from_root %op {
    ^bb0(%x: tensor<?x?x32xf32>, %w: tensor<?x?x32xf32>, %o: tensor<?x?xf32>):
      %r = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1)>], iterator_types = ["parallel", "parallel", "reduction", "reduction"]} ins(%x, %w : tensor<?x?x32xf32>, tensor<?x?x32xf32>) outs(%o : tensor<?x?xf32>) {
      ^bb1(%a: f32, %b: f32, %acc: f32):
        %p = arith.mulf %a, %b : f32
        %s = arith.addf %acc, %p : f32
        linalg.yield %s : f32
      } -> tensor<?x?xf32>
    } : (!transform.any_op) -> (!transform.any_value, !transform.any_value)
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_cpu.lowering_config<distribution = [8, 32, 0, 0], vector_common_parallel = [8, 1, 0, 0], vector_reduction = [0, 0, 1, 32]>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>>> -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  // The same for groups of 64 or more (64 inputs at a time).
  transform.named_sequence @match_qlinear_rows(%op: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %ins, %outs = transform.iree.match.cast_compatible_dag_from_root %op {
    ^bb0(%x: tensor<?x?x?xf32>, %w: tensor<?x?x?xf32>, %o: tensor<?x?xf32>):
      %r = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1)>], iterator_types = ["parallel", "parallel", "reduction", "reduction"]} ins(%x, %w : tensor<?x?x?xf32>, tensor<?x?x?xf32>) outs(%o : tensor<?x?xf32>) {
      ^bb1(%a: f32, %b: f32, %acc: f32):
        %p = arith.mulf %a, %b : f32
        %s = arith.addf %acc, %p : f32
        linalg.yield %s : f32
      } -> tensor<?x?xf32>
    } : (!transform.any_op) -> (!transform.any_value, !transform.any_value)
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_cpu.lowering_config<distribution = [8, 32, 0, 0], vector_common_parallel = [8, 1, 0, 0], vector_reduction = [0, 0, 1, 64]>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>>> -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  // A decode step over an affine-quantized weight in row tiles (`NumericContract::qlinear_rows`,
  // `affine_tiles`): x [groups, group_size] (one row) or [rows, groups, group_size] (up to 8)
  // against the weight dequantized in f32 [out / t, groups, group_size, t] (fused into this
  // dispatch as its producer), reduced over group_size into each group's sums. IREE's default
  // vectorises 8 inputs of a group, one lane per input 16 integers apart, and sums them across
  // the lanes (an 8960x1536 4-bit weight in groups of 64, tiles of 16, AMD Zen 3: one row 3.3
  // to 3.9 ms, 8 rows 22 ms). One input of 16 outputs of a tile per vector step keeps one output
  // in each lane, summing its products in order: one row 1.13 to 1.25 ms, 8 rows (8 by 8 outputs)
  // 4.0 to 4.5, 4 rows 2.4 to 2.6.
  transform.named_sequence @match_qlinear_tiled(%op: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %ins, %outs = transform.iree.match.cast_compatible_dag_from_root %op {
    ^bb0(%x: tensor<?x?xf32>, %w: tensor<?x?x?x?xf32>, %o: tensor<?x?x?xf32>):
      %r = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d1, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d3, d2)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%x, %w : tensor<?x?xf32>, tensor<?x?x?x?xf32>) outs(%o : tensor<?x?x?xf32>) {
      ^bb1(%a: f32, %b: f32, %acc: f32):
        %p = arith.mulf %a, %b : f32
        %s = arith.addf %acc, %p : f32
        linalg.yield %s : f32
      } -> tensor<?x?x?xf32>
    } : (!transform.any_op) -> (!transform.any_value, !transform.any_value)
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_cpu.lowering_config<distribution = [8, 0, 0, 0], vector_common_parallel = [1, 1, 16, 0], vector_reduction = [0, 0, 0, 1]>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>>> -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  // The same for several rows: 8 rows by 8 outputs per vector step.
  transform.named_sequence @match_qlinear_tiled_rows(%op: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
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
      lowering_config = #iree_cpu.lowering_config<distribution = [8, 8, 0, 0, 0], vector_common_parallel = [8, 1, 1, 8, 0], vector_reduction = [0, 0, 0, 0, 1]>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>>> -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  // A prompt chunk of up to 8 row tiles (128 rows; a 64-row chunk is 4) against a deep weight in
  // row tiles (`NumericContract::linear_tiled`; 4096 inputs or more: a down projection). These
  // tile shapes arise on AVX-512 targets: bf16 pairs (16 rows by 2 inputs, IREE's bf16 mmt4d
  // microkernel, with AVX512-BF16) and 32-row tiles of bf16 or f32 weights under f32 activations.
  // IREE 3.13's default gives each workgroup a single output tile at these depths, so every
  // weight tile is streamed once per row tile of x (4 times for a 64-row chunk). One workgroup
  // per weight tile covering every row tile reads each weight tile once. The vector steps are
  // IREE's own (each output still sums its inputs in order, so the results are the same bit for
  // bit). Measured on an AMD Zen 4 (2 threads, `linalg.mmt4d` alone, 64 rows against a 1536x8960
  // weight, medians of 7 to 10, alternated 3 or 4 times): bf16 pairs 6.7 to 7.5 ms against 4.9 to
  // 5.3; f32 by bf16 weights 10.4 to 11.6 against 9.3 to 9.8; f32 by f32 weights 11.8 to 12.8
  // against 9.1 to 9.9. Shallower weights (1536 inputs) already get every row tile per workgroup
  // from IREE; an encoder's 1024 patch rows (64 row tiles) run as fast either way.
  transform.named_sequence @match_mmt4d_bf16_pairs_deep(%op: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %ins, %outs = transform.iree.match.cast_compatible_dag_from_root %op {
    ^bb0(%x: tensor<?x?x16x2xbf16>, %w: tensor<?x?x16x2xbf16>, %o: tensor<?x?x16x16xf32>):
      %r = linalg.mmt4d ins(%x, %w : tensor<?x?x16x2xbf16>, tensor<?x?x16x2xbf16>) outs(%o : tensor<?x?x16x16xf32>) -> tensor<?x?x16x16xf32>
    } : (!transform.any_op) -> (!transform.any_value, !transform.any_value)
    %x = transform.get_operand %op[0] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.dim_bounds %x[1], umin = 2048, none : !transform.any_value
    transform.iree.match.dim_bounds %x[0], none, umax = 8 : !transform.any_value
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_cpu.lowering_config<distribution = [8, 1, 0, 0, 0, 0], vector_common_parallel = [1, 1, 0, 16, 16, 0], vector_reduction = [0, 0, 1, 0, 0, 2]>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<Mmt4dTilingExpert>>> -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  // The same for f32 activations against bf16 weights in tiles of 32 rows.
  transform.named_sequence @match_mmt4d_f32_bf16_deep(%op: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %ins, %outs = transform.iree.match.cast_compatible_dag_from_root %op {
    ^bb0(%x: tensor<?x?x16x1xf32>, %w: tensor<?x?x32x1xbf16>, %o: tensor<?x?x16x32xf32>):
      %r = linalg.mmt4d ins(%x, %w : tensor<?x?x16x1xf32>, tensor<?x?x32x1xbf16>) outs(%o : tensor<?x?x16x32xf32>) -> tensor<?x?x16x32xf32>
    } : (!transform.any_op) -> (!transform.any_value, !transform.any_value)
    %x = transform.get_operand %op[0] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.dim_bounds %x[1], umin = 4096, none : !transform.any_value
    transform.iree.match.dim_bounds %x[0], none, umax = 8 : !transform.any_value
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_cpu.lowering_config<distribution = [8, 1, 0, 0, 0, 0], vector_common_parallel = [1, 1, 0, 8, 32, 0], vector_reduction = [0, 0, 1, 0, 0, 1]>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<Mmt4dTilingExpert>>> -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  // The same for f32 weights in tiles of 32 rows.
  transform.named_sequence @match_mmt4d_f32_f32_deep(%op: !transform.any_op {transform.readonly}) -> (!transform.any_op, !transform.any_param) {
    %ins, %outs = transform.iree.match.cast_compatible_dag_from_root %op {
    ^bb0(%x: tensor<?x?x16x1xf32>, %w: tensor<?x?x32x1xf32>, %o: tensor<?x?x16x32xf32>):
      %r = linalg.mmt4d ins(%x, %w : tensor<?x?x16x1xf32>, tensor<?x?x32x1xf32>) outs(%o : tensor<?x?x16x32xf32>) -> tensor<?x?x16x32xf32>
    } : (!transform.any_op) -> (!transform.any_value, !transform.any_value)
    %x = transform.get_operand %op[0] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.dim_bounds %x[1], umin = 4096, none : !transform.any_value
    transform.iree.match.dim_bounds %x[0], none, umax = 8 : !transform.any_value
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_cpu.lowering_config<distribution = [8, 1, 0, 0, 0, 0], vector_common_parallel = [1, 1, 0, 8, 32, 0], vector_reduction = [0, 0, 1, 0, 0, 1]>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<Mmt4dTilingExpert>>> -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }
