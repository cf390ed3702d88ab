#!/usr/bin/env perl
# stream_mutants.pl — broken copies of the CUDA runtime code of the stage trainers, for the stream
# check's catalogue (NZ_EMU_CHECK=stream, tests/cuda/emu_check.sh). Each removes one ordering the
# trainers rely on; the text it changes must occur exactly once, or the mutant is not made.
#   stream_mutants.pl NAME GEN_DIR > mutant.cpp   (GEN_DIR: the rewritten common/kernels/cuda/ files)
#     comm_no_wait   comm_nccl.cu: the comm stream no longer waits for the compute stream before a
#                    collective (the cudaStreamWaitEvent of after_compute): the collective may read a
#                    gradient the backward's kernels have not written yet (stage2's reduce-scatter)
#     copy_no_wait   runtime.cu: offload's copy stream no longer waits for the compute stream before
#                    a copy: the gradient copied to the host may not be written yet
#     host_no_sync   runtime.cu: copy_stream_sync() no longer waits: the host's optimizer reads the
#                    pinned gradient buffer while the copy into it may still run
use strict;
use warnings;
my ($name, $dir) = @ARGV;
die "usage: stream_mutants.pl NAME GEN_DIR > out\n" unless $name && $dir;
my %mutants = (
  comm_no_wait => ["comm_nccl.cpp", qr/\n  NZ_CUDA_CHECK\(cudaStreamWaitEvent\(g_stream, g_inputs_ready, 0\)\);\n/,
                   "\n  // (mutant: the comm stream does not wait for the compute stream)\n"],
  copy_no_wait => ["runtime.cpp", qr/\n  NZ_CUDA_CHECK\(cudaStreamWaitEvent\(copy_stream\(\), compute_done, 0\)\);\n/,
                   "\n  // (mutant: the copy stream does not wait for the compute stream)\n"],
  host_no_sync => ["runtime.cpp", qr/void copy_stream_sync\(\) \{ NZ_CUDA_CHECK\(cudaStreamSynchronize\(copy_stream\(\)\)\); \}/,
                   "void copy_stream_sync() {}  // (mutant: the host does not wait for the copy stream)"],
);
my $m = $mutants{$name} or die "stream_mutants.pl: unknown mutant '$name' (" . join(", ", sort keys %mutants) . ")\n";
my ($file, $pattern, $replacement) = @$m;
open(my $in, '<', "$dir/$file") or die "stream_mutants.pl: cannot read $dir/$file: $!\n";
my $src = do { local $/; <$in> };
my $count = 0;
$count++ while $src =~ /$pattern/g;
die "stream_mutants.pl: $name: the text to change occurs $count times in $file, not once (the code changed?)\n"
  if $count != 1;
$src =~ s/$pattern/$replacement/;
print $src;
