// formulas.h — what each pipeline segment holds, to the byte: its model state and activations.
#pragma once
#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/kernels.h"  // Attention
#include "layout.h"
#include "pipeline/pipeline.h"  // PipelinePlan
#include "zero_formulas.h"      // StateBytes

namespace nz {

// ---- pipeline (pipeline.h): what segment s holds, with P_s = Σ padded over its units and U_s its
// largest unit (padded for the D replicas), V x C the tied wte ----
//   params   e P_s                (+ e VC on the last segment: its copy of wte for the LM head)
//   grads    e P_s + e U_s        (+ e VC on the last segment: the head's d wte, on its way to segment 0)
//   master   4 P_s (bf16, fp16), Adam m, v 4 P_s each: the optimizer state of its units only
//            (--zero 1: P_s / D each, its replica's slice of every unit, as stage1 on D ranks)
// (with P = 1 the segment holds everything: stage0_ddp's bytes).
StateBytes pipeline_segment_bytes(const Layout& L, DType dt, const PipelinePlan& plan, int segment);
// Activations of segment s holding `slots` micro-batches (activation_slots: K for GPipe, min(P-s, K) for
// 1F1B), term by term as expected_activation_bytes: per slot the segment's input r(BTCe) (the embedding's
// output on segment 0), its blocks' internals and outputs, the head's ends on the last segment, the tokens
// on the first and the targets on the last r(4BT) each; once, the backward's grads of one block.
uint64_t pipeline_activation_bytes(const GPTConfig& cfg, int B, int T, DType dt, bool checkpointing, Attention attn,
                                   const PipelinePlan& plan, int segment, int accum);

}  // namespace nz
