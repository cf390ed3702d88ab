#!/usr/bin/env perl
# flash_mutants.pl — broken copies of common/kernels/cuda/kernels_flash_attention.cu for the emulator's
# catalogue of bugs its checks must catch (tests/cuda/emu_sanitizer.sh). Each mutant removes or moves
# one synchronisation of the tensor-core kernels; the text it changes must occur exactly once, or the
# mutant is not made (the kernels changed: update the pattern).
#   flash_mutants.pl NAME < kernels_flash_attention.cpp > mutant.cpp
#     dq_no_syncwarp     the __syncwarp before dq's WMMA load of dS (lanes wrote dS) removed
#     early_prefetch     the forward's next K, V tile issued before the barrier that ends every warp's
#                        reads of that buffer (the previous tile)
#     q_no_barrier       the forward's __syncthreads after the Q fragment loads removed: the first K, V
#                        tile is issued into buffer 0 while other warps may still load Q from it
use strict;
use warnings;
my $name = $ARGV[0] or die "usage: flash_mutants.pl NAME < in > out\n";
my $src = do { local $/; <STDIN> };
my %mutants = (
  dq_no_syncwarp => [qr/\n    __syncwarp\(\);\n(\n    \/\/ tensor cores: dq \+= dS K)/, sub { "\n    // (mutant: no __syncwarp)\n$1" }],
  early_prefetch => [
    qr/(    \/\/ this tile lands[^\n]*\n[^\n]*\n)    wait_staged\(\);\n((?:    const T\* [KV]s = [^\n]*\n){2})((?:    [^\n]*\n){5})/,
    sub { "$1$3    wait_staged();  // (mutant: after the next tile's issue)\n$2" }],
  q_no_barrier => [qr/\n  __syncthreads\(\);  \/\/ every warp has its Q: buffer 0 can take the first K, V tile\n/,
                   sub { "\n  // (mutant: no __syncthreads after the Q loads)\n" }],
);
my $m = $mutants{$name} or die "flash_mutants.pl: unknown mutant '$name' (" . join(", ", sort keys %mutants) . ")\n";
my ($pattern, $replacement) = @$m;
my $count = 0;
$count++ while $src =~ /$pattern/g;
die "flash_mutants.pl: $name: the text to change occurs $count times, not once (the kernels changed?)\n" if $count != 1;
$src =~ s/$pattern/$replacement->()/e;
print $src;
