# tests/zeropp/mutants.mk — deliberately broken copies of zeropp, for the tests of the tests:
# tests/zeropp/test_zeropp.cpp runs each one and requires the bit-for-bit checks (against the
# fake-quant reference, or stage3 for hpZ) to see the bug. `make tests` builds them into $(BUILD)/mutants/bin/.
#
#   sum_kept_quantized    qgZ's running sum is quantized to int4 again after every addition (what a
#                         ring reduce of quantized blocks does): the error accumulates, instead of
#                         every block being dequantized before one fp32 sum
#   per_tensor_scale      one scale per slice of a unit instead of one per block (int8 and int4)
#   own_slice_exact       qgZ adds this rank's own slice unquantized (only the others' go through int4)
#   hpz_stale             hpZ's secondary shard is filled in the first step only, never refreshed after
#                         an optimizer step: the backward computes with the parameters of step 1
#   bf16_read_as_fp16     qwZ quantizes bf16 parameters reading their bits as fp16 (DeepSpeed's bug)
#   two_hops_exact_across qgZ's two hops without the re-quantization between them: the node's fp32 sums
#                         are reduce-scattered across nodes as they are (no int4 across nodes)
#   two_hops_nodes_reversed  hop 2 adds the nodes' sums in the order M-1, ..., 0 (seen with 3 nodes or
#                         more: two terms add the same either way)
#   two_hops_flat_group   hop 2's all-to-all runs over the whole world (the flat all-to-all's group)
#                         instead of the ranks of my local index on every node
#   two_hops_node_groups  hop 2's group is consecutive ranks, as the nodes are, not one rank per node
#
# Each sed must change exactly ZEROPP_MUTANT_LINES_<name> lines: if a change to zeropp makes a
# pattern miss, the build stops and names the mutant to fix.
#   nan_in_params         not a bug but a fault: rank 1 puts a NaN in its parameter slice before step 2's
#                         forward; --qwz must stop the job with one line and exit code 2
#   inf_in_grad           a fault again: in step 2 rank 1's gradient of lnf holds one infinity (an fp16
#                         overflow) before qgZ; its block dequantizes to NaN, so an fp16 run must skip
#                         that step and no other
#   inf_hidden            the same fault, and a bug: qgZ adds an overflowed (NaN) block as zeros, so the
#                         overflow check never sees it and the step updates the model
ZEROPP_MUTANTS := sum_kept_quantized per_tensor_scale own_slice_exact hpz_stale bf16_read_as_fp16 nan_in_params \
                  inf_in_grad inf_hidden two_hops_exact_across two_hops_nodes_reversed two_hops_flat_group \
                  two_hops_node_groups
ZEROPP_MUTANT_SED_sum_kept_quantized := \
  -e 's/^\( *\)if (r > 0) for (size_t i = 0; i < n; i++) sum\[i\] += part\[i\];$$/\1if (r > 0) { for (size_t i = 0; i < n; i++) sum[i] += part[i]; quantize_packed(qg, DType::F32, sum, n, slot); dequantize_packed(qg, slot, n, DType::F32, sum); }/'
ZEROPP_MUTANT_LINES_sum_kept_quantized := 1
ZEROPP_MUTANT_SED_per_tensor_scale := \
  -e 's/const BlockQuant qw{8, zpp.qw_block}, qg{4, zpp.qg_block};/const BlockQuant qw{8, L.max_unit_padded}, qg{4, L.max_unit_padded};/'
ZEROPP_MUTANT_LINES_per_tensor_scale := 1
ZEROPP_MUTANT_SED_own_slice_exact := \
  -e 's/^\( *\)dequantize_packed(qg, slot + r \* wire, n, DType::F32, r == 0 ? sum : part);$$/\1if (r == rank) to_f32(dt, elem_ptr(bucket, r * n, e), n, r == 0 ? sum : part); else dequantize_packed(qg, slot + r * wire, n, DType::F32, r == 0 ? sum : part);/'
ZEROPP_MUTANT_LINES_own_slice_exact := 1
ZEROPP_MUTANT_SED_hpz_stale := \
  -e 's/^\( *\)refresh_secondary(u, p); /\1if (step == run.first_step()) refresh_secondary(u, p); /'
ZEROPP_MUTANT_LINES_hpz_stale := 1
ZEROPP_MUTANT_SED_bf16_read_as_fp16 := \
  -e 's/quantize_finite(qw, dt, my_P(u), n,/quantize_finite(qw, dt == DType::BF16 ? DType::F16 : dt, my_P(u), n,/'
ZEROPP_MUTANT_LINES_bf16_read_as_fp16 := 1
ZEROPP_MUTANT_SED_nan_in_params := \
  -e 's/^\( *\)run.phase("forward");$$/\1run.phase("forward"); if (step == 1 \&\& rank == 1) static_cast<float*>(params.data())[5] = NAN;/'
ZEROPP_MUTANT_LINES_nan_in_params := 1
ZEROPP_INF_IN_GRAD := \
  -e 's/^\( *\)if (zpp.qgz) reduce_scatter_int4(u, mine);/\1{ if (step == 1 \&\& rank == 1 \&\& u == LNF) static_cast<f16*>(bucket.data())[3] = store<f16>(INFINITY); } if (zpp.qgz) reduce_scatter_int4(u, mine);/'
ZEROPP_MUTANT_SED_inf_in_grad := $(ZEROPP_INF_IN_GRAD)
ZEROPP_MUTANT_LINES_inf_in_grad := 1
ZEROPP_MUTANT_SED_inf_hidden := $(ZEROPP_INF_IN_GRAD) \
  -e 's/^\( *\)from_f32(dt, sum, n, mine);/\1for (size_t i = 0; i < n; i++) { if (std::isnan(sum[i])) sum[i] = 0; } from_f32(dt, sum, n, mine);/'
ZEROPP_MUTANT_LINES_inf_hidden := 2
ZEROPP_MUTANT_SED_two_hops_exact_across := \
  -e 's/^\( *\)quantize_packed(qg, DType::F32, node + k \* n, n, buf + k \* q);$$/\1if (k == 0) across->reduce_scatter(qg_node.data(), qg_sum.data(), n, DType::F32);/' \
  -e 's/^\( *\)across->all_to_all_packed(buf, q, n); .*$$/\1const int M = 0;  \/\/ hop 2 summed already/'
ZEROPP_MUTANT_LINES_two_hops_exact_across := 2
ZEROPP_MUTANT_SED_two_hops_nodes_reversed := \
  -e 's/^\( *\)for (int k = 0; k < M; k++) {  \/\/ hop 2.s sum, in node order$$/\1for (int k = M - 1; k >= 0; k--) {/' \
  -e 's/k == 0 ? total : part);$$/k == M - 1 ? total : part);/' \
  -e 's/^\( *\)if (k > 0) for (size_t i = 0; i < n; i++) total\[i\] += part\[i\];$$/\1if (k < M - 1) for (size_t i = 0; i < n; i++) total[i] += part[i];/'
ZEROPP_MUTANT_LINES_two_hops_nodes_reversed := 3
ZEROPP_MUTANT_SED_two_hops_flat_group := \
  -e 's/^\( *\)across->all_to_all_packed(buf, q, n);/\1comm.all_to_all_packed(buf, q, n);/'
ZEROPP_MUTANT_LINES_two_hops_flat_group := 1
ZEROPP_MUTANT_SED_two_hops_node_groups := \
  -e 's/across = std::make_unique<Comm>(comm, rank % GN, rank);/across = std::make_unique<Comm>(comm, rank \/ GN, rank);/'
ZEROPP_MUTANT_LINES_two_hops_node_groups := 1

include tests/lib/mutants.mk
$(eval $(call train_mutants,ZEROPP,zeropp,zeropp,tests/zeropp/mutants.mk))
