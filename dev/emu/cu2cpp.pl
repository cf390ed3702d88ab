#!/usr/bin/env perl
# cu2cpp.pl — turns a .cu file (or a .cuh header) of common/kernels/cuda/ into C++ for nz_emu (dev/emu/include/cuda_runtime.h):
#   name<<<grid, block[, smem[, stream]]>>>(args)  ->  ::nz_emu::launch(name, "name", grid, block...)(args)
#   extern __shared__ [__align__(N)] float buf[];   ->  float* buf = (the launch's dynamic shared memory,
#                                                       aligned to 128 bytes: emu.cpp)
#   __shared__ float s[N][M];                       ->  static float s[N][M]; and the checks told of it
# Lines keep their numbers, and a #line directive names the original file, so compiler errors and
# gdb point into common/kernels/cuda/*.cu. Anything it does not understand stops the build.
use strict;
use warnings;
my $file = $ARGV[0] or die "usage: cu2cpp.pl file.cu\n";
open(my $in, '<', $file) or die "cu2cpp.pl: cannot read $file: $!\n";
my $src = do { local $/; <$in> };
$src =~ s{\b([A-Za-z_]\w*(?:<[^<>;()]*>)?)<<<(.*?)>>>\(}{::nz_emu::launch($1, "$1", $2)(}g;
$src =~ s{\bextern\s+__shared__\s+(?:__align__\(\d+\)\s+)?(\w+)\s+(\w+)\[\];}{$1* $2 = static_cast<$1*>(::nz_emu::dynamic_shared());}g;
# A static shared array stays a C++ static, followed on the same line by the call that tells the
# emulator's checks where it is (NZ_EMU_CHECK: poisoned per block, bounds, races; check.cpp).
$src =~ s{\b__shared__\s+(?:__align__\((\d+)\)\s+)?([A-Za-z_][\w:]*)\s+(\w+)((?:\[[^\];]+\])+)\s*;}{"static " . ($1 ? "alignas($1) " : "") . "$2 $3$4; ::nz_emu::check::static_shared($3, sizeof($3), \"$3\", __FILE__, __LINE__);"}ge;
if ($src =~ /(<<<|>>>|extern\s+__shared__)/) {
  die "cu2cpp.pl: $file: a launch or dynamic shared array it cannot rewrite (near '$1')\n";
}
print "#line 1 \"$file\"\n", $src;
