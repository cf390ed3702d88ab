// quiz.js — the quiz of `zero_estimate --quiz` in the page, with instant feedback (docs/explorer.md).
// The questions, the grading, the worked answers and the result line are zero_estimate's own: the page
// writes the answers given so far to a file in the module's memory and runs
// `zero_estimate --quiz --seed S --count N --check FILE --explain --result`, as a learner would on a
// terminal, then shows each verdict beside its question.
"use strict";

window.nzQuiz = (function () {
  const $ = (id) => document.getElementById(id);
  let seed = 1, count = 10;

  function build() {
    const area = $("quiz-area");
    area.innerHTML = `
      <p>The questions of <code>zero_estimate --quiz</code>: the same seed gives the same questions, on the
      command line or here. Answer in each question's unit; each answer is checked when you press Enter.</p>
      <label class="inline">Seed <input id="quiz-seed" inputmode="numeric" size="6" value="1"></label>
      <label class="inline">Questions <input id="quiz-count" inputmode="numeric" size="4" value="10"></label>
      <button type="button" id="quiz-start">Start the quiz</button>
      <ol id="quiz-list"></ol>
      <p id="quiz-score" role="status" aria-live="polite"></p>
      <label>Result line for your instructor, who checks it with <code>zero_estimate --verify 'LINE'</code>:
        <textarea id="quiz-result" readonly rows="2" spellcheck="false"></textarea></label>
      <h3>For the instructor: check a learner's result line</h3>
      <label>Result line <input id="verify-line" size="90"></label>
      <button type="button" id="verify-button">Verify</button>
      <p id="verify-out" role="status" aria-live="polite"></p>`;
    $("quiz-start").addEventListener("click", start);
    $("verify-button").addEventListener("click", verify);
    $("verify-line").addEventListener("keydown", (e) => { if (e.key === "Enter") verify(); });
  }

  function start() {
    seed = $("quiz-seed").value.trim();
    count = $("quiz-count").value.trim();
    const r = window.nzExplorer.zeroEstimate(["--quiz", "--seed", seed, "--count", count]);
    const list = $("quiz-list");
    list.replaceChildren();
    $("quiz-score").textContent = r.rc === 0 ? "" : r.err;
    $("quiz-score").className = r.rc === 0 ? "" : "wrong";
    $("quiz-result").value = "";
    if (r.rc !== 0) return;
    for (const m of r.out.matchAll(/^Q(\d+)\. (.*)$/gm)) {
      const n = m[1];
      const li = document.createElement("li");
      li.className = "question";
      li.innerHTML = `<p></p><label>Answer <input id="quiz-q${n}" size="12" inputmode="decimal"></label>
        <button type="button">Check</button><div class="verdict" id="quiz-v${n}" aria-live="polite"></div>`;
      li.querySelector("p").textContent = m[2];
      li.querySelector("input").setAttribute("aria-label", "answer to question " + n);
      li.querySelector("input").addEventListener("keydown", (e) => { if (e.key === "Enter") check(); });
      li.querySelector("button").addEventListener("click", check);
      list.append(li);
    }
    const first = $("quiz-q1");
    if (first) first.focus();
  }

  // Grades every answer given so far: zero_estimate's verdict lines, its worked answers under wrong
  // ones, its score and its result line.
  function check() {
    const given = [];
    for (let n = 1; $("quiz-q" + n); n++) {
      const v = $("quiz-q" + n).value.trim();
      if (v) given.push(`Q${n} ${v}`);
    }
    window.nzExplorer.writeFile("/answers.txt", given.join("\n") + "\n");
    const r = window.nzExplorer.zeroEstimate(["--quiz", "--seed", seed, "--count", count, "--check", "/answers.txt",
                                              "--explain", "--result"]);
    const score = $("quiz-score");
    if (r.rc === 2) {  // an answer that is not a number: the command line's own one-line error
      score.textContent = r.err;
      score.className = "wrong";
      return;
    }
    let last = null, answered = 0, right = 0;
    for (const line of r.out.split("\n")) {
      const m = /^Q(\d+)  (.*)$/.exec(line);
      if (m) {
        last = $("quiz-v" + m[1]);
        last.replaceChildren();
        if (m[2] === "no answer") { last = null; continue; }
        answered++;
        const ok = m[2].startsWith("right");
        right += ok;
        const v = document.createElement("p");
        v.className = ok ? "right" : "wrong";
        v.textContent = m[2];
        last.append(v);
      } else if (line.startsWith("    ") && last) {
        const x = document.createElement("p");
        x.className = "explain";
        x.textContent = line.trim();
        last.append(x);
      } else if (line.startsWith("result: ")) {
        $("quiz-result").value = line.slice(8);
        fitHeight($("quiz-result"));
      }
    }
    score.className = "";
    score.textContent = `${right} of ${count} right` + (answered < count ? ` (${answered} answered)` : " — the quiz is done");
  }

  // The result line wraps in its box, which grows to show all of it: the whole line is copied.
  function fitHeight(box) {
    box.style.height = "auto";
    box.style.height = box.scrollHeight + 2 + "px";
  }

  // zero_estimate --verify LINE, in the page: its code checked, its answers graded again.
  function verify() {
    const r = window.nzExplorer.zeroEstimate(["--verify", $("verify-line").value.trim()]);
    const out = $("verify-out");
    out.textContent = r.rc === 2 ? r.err : r.out;
    out.className = r.rc === 0 ? "right" : "wrong";
  }

  return { init: build, start: start, check: check, verify: verify };
})();
