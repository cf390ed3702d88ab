"""doc_lines.py — is a line quoted in docs/faq.md among the lines a command printed?

Runs of spaces compare as one. A number with a decimal point compares within 0.2% (relative): the
losses and norms a page quotes were measured on one CPU, and another CPU's BLAS may round the last
digits differently; every other word, integers (bytes, element counts, steps) included, compares
exactly. Used by faq_doc_check.sh and bugs_check.sh."""
import re

_NUM = re.compile(r"[-+]?\d+\.\d+(?:[eE][-+]?\d+)?")


def _close(a, b):
    x, y = float(a), float(b)
    return x == y or abs(x - y) <= 2e-3 * max(abs(x), abs(y))


def same(quoted, printed):
    q, p = " ".join(quoted.split()), " ".join(printed.split())
    if q == p:
        return True
    if _NUM.sub("#", q) != _NUM.sub("#", p):  # the words around the numbers differ
        return False
    return all(_close(a, b) for a, b in zip(_NUM.findall(q), _NUM.findall(p)))


def missing(quoted_lines, printed_lines):
    """The quoted lines no printed line matches."""
    return [q for q in quoted_lines if not any(same(q, p) for p in printed_lines)]


def quoted_block(page_text, command):
    """The lines quoted under `$ command` in a ```console block of the page (the next `$` or the
    block's end ends them; `...` stands for lines left out)."""
    for block in re.findall(r"```console\n(.*?)```", page_text, re.S):
        lines, take = [], False
        for line in block.splitlines():
            if line.startswith("$ "):
                if take:
                    break
                take = line[2:].strip() == command
            elif take and line.strip() and line.strip() != "...":
                lines.append(line)
        if take:
            return lines
    return None
