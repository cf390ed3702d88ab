"""The explorer's certificate box (tools/explorer/index.html, docs/certificates.md) in headless
Chromium and Firefox, against `zero_estimate --verify LINE --course-pub FILE`.

A course's key pair and a certificate are made here with the native zero_estimate; forgeries are made
with tests/tools/ed25519_ref.py (an Ed25519 apart from libsodium and from the browsers' WebCrypto).
For each line the page's verdict, checked with the browser's WebCrypto Ed25519 and SHA-256 and
zero_estimate's grading in the page, must be the command line's, word for word: the real
certificate verified, and an edition-1 certificate as issued (tests/tools/quiz_edition1/); an edited
edition, an edited score, an edited answer, another student's id, another key's
signature (under its own key id or this course's), a replayed seed and an unearned score (both signed
with the course's own key), and the course's certificate under another course's key, each not
verified; a line that is not a certificate refused. And the check can fail: a copy of the page whose
box skips the signature is caught.

Usage: certificate_page_check.py PAGE_DIR ZERO_ESTIMATE BROWSER... (chromium, firefox). Prints
NZRESULT lines (quiz.page.BROWSER.*).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "lib"))
sys.path.insert(0, here)
import ed25519_ref  # noqa: E402
from webdriver import Browser, Firefox  # noqa: E402

page_dir, est = sys.argv[1], sys.argv[2]


def run(*args):
    p = subprocess.run([est] + list(args), capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout.strip(), p.stderr.strip()


def field(line, name, value):
    return re.sub(rf" {name}=\S*", f" {name}={value}", line, count=1)


def signed(body, seed):
    return body + " sig=" + ed25519_ref.sign(seed, body.encode()).hex()


edition1_dir = os.path.join(here, "quiz_edition1")
edition1_cert = open(os.path.join(edition1_dir, "certificate_carol.txt")).read().strip()
edition1_pub = os.path.join(edition1_dir, "course.pub")


def cases(tmp):
    """(name, certificate line, public key file) for each case."""
    keys, other = os.path.join(tmp, "keys"), os.path.join(tmp, "other")
    for d in (keys, other):
        rc, out, err = run("--course-keys", d)
        if rc:
            raise RuntimeError(f"--course-keys {d}: exit {rc}: {err}")
    pub_file = os.path.join(keys, "course.pub")
    sk_seed = bytes.fromhex(open(os.path.join(keys, "course.key")).read().split()[1][:64])
    pub = open(pub_file).read().split()[1]

    def quiz_key(*flags):
        return re.findall(r"^Q\d+ (\S+)", run("--quiz", *flags, "--key")[1], re.M)

    alice = re.search(r"seed (\d+)", run("--quiz", "--student", "alice", "--course-pub", pub_file)[1]).group(1)
    bob = re.search(r"seed (\d+)", run("--quiz", "--student", "bob", "--course-pub", pub_file)[1]).group(1)
    right = quiz_key("--seed", alice)
    answers = os.path.join(tmp, "alice.txt")
    with open(answers, "w") as f:
        f.write(f"nzquiz-answers2 student=alice seed={alice} count=10\n")
        for i, a in enumerate(right):
            f.write(f"Q{i + 1} {float(a) * 1.5:.6g}\nQ{i + 1} {a}\n" if i == 2 else f"Q{i + 1} {a}\n")
    rc, out, err = run("--quiz", "--sign", answers, "--student", "alice", "--signing-key", os.path.join(keys, "course.key"))
    cert = out.removeprefix("certificate: ")
    if rc or not cert.startswith("nzcert2 "):
        raise RuntimeError(f"--sign: exit {rc}: {err}")
    body = cert[:cert.rindex(" sig=")]
    first = body.split(" first=")[1].split()[0].split(",")
    other_seed = os.urandom(32)
    other_id = ed25519_ref.public(other_seed).hex()[:16]
    bob_body = field(field(field(field(body, "seed", bob), "first", ",".join(quiz_key("--seed", bob))),
                           "attempts", ",".join(["1"] * 10)), "score", "10/10")
    return [
        ("the_certificate", cert, pub_file),
        ("an_edited_score", field(cert, "score", "10/10"), pub_file),
        ("an_edited_answer", field(field(cert, "first", ",".join(first[:2] + [right[2]] + first[3:])), "score", "10/10"),
         pub_file),
        ("another_students_id", field(cert, "student", "bob"), pub_file),
        ("another_keys_signature", signed(field(body, "key", other_id), other_seed), pub_file),
        ("another_key_under_this_keys_id", signed(body, other_seed), pub_file),
        ("a_replayed_seed_signed_by_the_course_key", signed(bob_body, sk_seed), pub_file),
        ("an_unearned_score_signed_by_the_course_key", signed(field(body, "score", "10/10"), sk_seed), pub_file),
        ("under_another_courses_key", cert, os.path.join(other, "course.pub")),
        ("not_a_certificate", "nzcert1 student=alice seed=-1", pub_file),
        # an edition-1 certificate as issued (tests/tools/quiz_edition1/), graded against edition 1; and
        # alice's renamed to edition 1, whose signature no longer holds
        ("the_edition1_certificate", edition1_cert, edition1_pub),
        ("an_edited_edition", cert.replace("nzcert2 ", "nzcert1 ", 1), pub_file),
    ], pub


CHECK = """
const [line, pub] = arguments;
const out = document.getElementById("cert-out");
out.dataset.done = "";
document.getElementById("cert-line").value = line;
document.getElementById("cert-pub").value = pub;
document.getElementById("cert-verify").click();
"""


def main(kind, all_cases, directory, label="certificate_verdicts_are_zero_estimates"):
    """The page in `directory` against zero_estimate: True when every verdict agrees."""
    page = "file://" + os.path.abspath(os.path.join(directory, "index.html"))
    browser = Browser(1024, 768) if kind == "chromium" else Firefox(1024, 768)
    bad, seen = [], 0
    try:
        browser.get(page)
        loaded = browser.wait_for("return document.body.dataset.ready === '1'", timeout=60)
        if not loaded:
            bad.append("the page did not load")
        for name, line, pub_file in all_cases if loaded else []:
            pub_line = open(pub_file).read().strip()
            browser.run(CHECK, line, pub_line)
            if not browser.wait_for("return document.getElementById('cert-out').dataset.done === '1'", timeout=30):
                bad.append(f"{name}: no verdict")
                continue
            text, cls, verdict = browser.run("const o = document.getElementById('cert-out');"
                                             "return [o.textContent, o.className, o.dataset.verdict]")
            rc, out, err = run("--verify", line, "--course-pub", pub_file)
            seen += 1
            if rc == 0:
                ok = (text == out and cls == "right" and verdict == "verified" and
                      name in ("the_certificate", "the_edition1_certificate"))
            elif rc == 1:
                ok = (text == out and cls == "wrong" and verdict == "not" and
                      name not in ("the_certificate", "the_edition1_certificate"))
            else:
                ok = verdict == "error" and cls == "wrong" and name == "not_a_certificate"
            if not ok:
                bad.append(f"{name}: page [{verdict}] '{text}', zero_estimate exit {rc} '{out or err}'")
    finally:
        browser.close()
    if label:
        print(f"NZRESULT {'PASS' if not bad else 'FAIL'} quiz.page.{kind}.{label} "
              f"({seen} of {len(all_cases)} lines, WebCrypto Ed25519; {'; '.join(bad[:3])})", flush=True)
    return not bad


def broken_page_is_caught(kind, all_cases, tmp):
    """A copy of the page whose box never refuses a signature: the same comparison must fail."""
    broken = os.path.join(tmp, "broken")
    shutil.copytree(page_dir, broken)
    html = os.path.join(broken, "index.html")
    text = open(html).read()
    mutated = text.replace("if (!ok)\n", "if (false)\n", 1)
    open(html, "w").write(mutated)
    caught = mutated != text and not main(kind, all_cases, broken, label=None)
    print(f"NZRESULT {'PASS' if caught else 'FAIL'} quiz.page.{kind}.a_box_that_skips_the_signature_is_caught",
          flush=True)


if __name__ == "__main__":
    tmp = tempfile.mkdtemp()
    try:
        all_cases, _ = cases(tmp)
        for kind in sys.argv[3:]:
            main(kind, all_cases, page_dir)
        if sys.argv[3:]:
            broken_page_is_caught(sys.argv[3], all_cases, tmp)
    finally:
        shutil.rmtree(tmp)
