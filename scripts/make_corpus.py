#!/usr/bin/env python3
"""Generates data/corpus.txt, the default training text that ships with nanoZeRO.

Small stories about a village, written from a hand-made grammar with a fixed seed, so the file is
the same every time. The text has structure at every scale a byte-level model can learn: spelling,
common words, grammar, names that recur within a story, and a story shape (opening, events, end).

    python3 scripts/make_corpus.py [--bytes N] [--out data/corpus.txt]
"""
import argparse
import random

NAMES = ["Ada", "Ben", "Cora", "Dev", "Elin", "Finn", "Gita", "Hugo", "Iris", "Jon", "Kira", "Leo",
         "Mina", "Noor", "Omar", "Pia", "Quinn", "Rosa", "Sami", "Tess", "Uma", "Vik", "Wren", "Yara"]
ANIMALS = ["cat", "dog", "goat", "fox", "owl", "horse", "duck", "rabbit", "crow", "mouse"]
PLACES = ["the mill", "the river", "the old bridge", "the market", "the forest", "the hill",
          "the bakery", "the harbour", "the school", "the garden", "the well", "the library"]
THINGS = ["a red kite", "a silver key", "a loaf of bread", "a map", "a lantern", "a basket of apples",
          "a wooden boat", "a letter", "a blue scarf", "a small drum", "a jar of honey", "a compass"]
ADJ = ["quiet", "bright", "cold", "warm", "windy", "long", "strange", "busy", "gentle", "grey"]
TIMES = ["One morning", "Late in the evening", "On a {adj} day", "Before sunrise", "After the rain",
         "In the middle of winter", "At noon", "When the bells rang"]
FEEL = ["happy", "tired", "curious", "worried", "proud", "surprised", "calm", "hungry"]
VERBS_GO = ["walked to", "ran to", "went to", "hurried to", "wandered to", "climbed up to"]
ENDINGS = ["and that is why {a} still visits {p} every week.",
           "and from then on {a} and {b} were the best of friends.",
           "and everyone in the village agreed it had been a good day.",
           "and {a} kept {t} safe for many years.",
           "and the {an} was never seen near {p} again."]


def sentence(rng, a, b, an, p, t):
    forms = [
        "{A} {go} {p} with {t}.",
        "There {a} met {B}, who was feeling {f}.",
        "\"Have you seen my {an}?\" asked {B}.",
        "\"I think it went to {p2},\" said {A}.",
        "The {an} was sitting next to {t}, looking {f}.",
        "{A} and {B} {go} {p2} together.",
        "It was {adj} and the path was {adj2}.",
        "{B} laughed and gave {A} {t2}.",
        "{A} counted {n} {ans} on the way to {p2}.",
        "Nobody knew who had left {t} at {p}.",
        "{A} was {f}, so {A} sat down and waited.",
        "\"Thank you,\" said {B}. \"Now I can go home.\"",
    ]
    s = rng.choice(forms)
    plural = {"fox": "foxes", "mouse": "mice"}.get(an, an + "s")
    return s.format(A=a, B=b, a=a, an=an, ans=plural, p=p, t=t, go=rng.choice(VERBS_GO), f=rng.choice(FEEL),
                    p2=rng.choice(PLACES), t2=rng.choice(THINGS), adj=rng.choice(ADJ),
                    adj2=rng.choice(ADJ), n=rng.randint(2, 12))


def story(rng):
    a, b = rng.sample(NAMES, 2)
    an, p, t = rng.choice(ANIMALS), rng.choice(PLACES), rng.choice(THINGS)
    opening = rng.choice(TIMES).format(adj=rng.choice(ADJ))
    lines = [f"{opening}, {a} found {t} near {p}."]
    for _ in range(rng.randint(3, 8)):
        lines.append(sentence(rng, a, b, an, p, t))
    end = rng.choice(ENDINGS).format(a=a, b=b, p=p, t=t, an=an)
    lines.append("In the end they went home, " + end)
    return " ".join(lines) + "\n\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=int, default=1_000_000)
    ap.add_argument("--out", default="data/corpus.txt")
    ap.add_argument("--seed", type=int, default=2024)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    out, n = [], 0
    while n < args.bytes:
        s = story(rng)
        out.append(s)
        n += len(s)
    with open(args.out, "w") as f:
        f.write("".join(out))
    print(f"wrote {n} bytes to {args.out}")


if __name__ == "__main__":
    main()
