// explorer_wasm.js — runs the explorer's zero_estimate.js (WebAssembly) under Node, as the page does:
// reads a JSON array of argument lists on stdin, calls main() with each, and prints a JSON array of
// {rc, out, err}: what a terminal would show. tests/tools/explorer_wasm_check.py compares them with the
// native build's. Usage: node explorer_wasm.js PAGE_DIR < args.json
"use strict";
const path = require("path");
const create = require(path.resolve(process.argv[2], "zero_estimate.js"));
let out = [], err = [];
let input = "";
process.stdin.on("data", (d) => (input += d));
process.stdin.on("end", () => {
  create({ print: (l) => out.push(l), printErr: (l) => err.push(l) }).then((m) => {
    const results = JSON.parse(input).map((args) => {
      out = [];
      err = [];
      const rc = m.callMain(args);
      return { rc: rc, out: out.join("\n"), err: err.join("\n") };
    });
    process.stdout.write(JSON.stringify(results));
  });
});
