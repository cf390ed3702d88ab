// hooks.h — what ZeRO++ hands the Trainer (rung.h): flag checks, state bytes, report.
// Its switches from the command line; the state bytes it adds to stage3's; its JSON object.
#pragma once
#include "zeropp/formulas.h"  // ZeroppConfig

namespace nz {

struct Args;    // input/cli.h
class Comm;     // comm.h
class Trainer;  // trainer.h

// ZeRO++'s switches from the command line and the machines. ZeRO++'s nodes are the machines when the
// ranks run on several (--hpz and --node-size must then say the same G; a mismatch is one line),
// else simulated on one: --hpz's G, --node-size, or all ranks one node.
ZeroppConfig zeropp_config(const Args& a, const Comm& comm);
// ZeRO++'s set-up (a RungSetUp, rung.h): its flags checked, its state bytes and report hooked in.
void set_zeropp_hooks(Trainer& run);
// rank 0's line before training (none with --quiet): the switches, their blocks, the nodes
void print_zeropp_switches(Trainer& run, const ZeroppConfig& zpp);

}  // namespace nz
