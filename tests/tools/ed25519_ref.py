"""ed25519_ref.py — Ed25519 (RFC 8032) in plain Python, slow and short: the quiz's tests check the
certificates zero_estimate signs with libsodium against this independent implementation, and forge
certificates with it (signed with another key, or with the course's own key over edited fields).

Command line (used by tests/tools/quiz_check.sh):
  ed25519_ref.py selftest                    RFC 8032's test 1 (the empty message), exit 0 when it holds
  ed25519_ref.py public SEED_HEX             the public key of a 32-byte secret seed
  ed25519_ref.py sign SEED_HEX MESSAGE       the signature (128 hex digits) of MESSAGE (UTF-8)
  ed25519_ref.py verify PUB_HEX SIG_HEX MESSAGE   exit 0 when SIG is PUB's signature of MESSAGE
"""
import hashlib
import sys

P = 2**255 - 19                      # the field
L = 2**252 + 27742317777372353535851937790883648493  # the group's order
D = -121665 * pow(121666, P - 2, P) % P


def inv(x):
    return pow(x, P - 2, P)


def recover_x(y, sign):
    """x of the curve point with this y and x's low bit `sign`, or None."""
    if y >= P:
        return None
    x2 = (y * y - 1) * inv(D * y * y + 1) % P
    if x2 == 0:
        return None if sign else 0
    x = pow(x2, (P + 3) // 8, P)
    if (x * x - x2) % P:
        x = x * pow(2, (P - 1) // 4, P) % P
    if (x * x - x2) % P:
        return None
    if x & 1 != sign:
        x = P - x
    return x


# points in extended coordinates (X, Y, Z, T), x = X/Z, y = Y/Z, xy = T/Z
def add(a, b):
    A = (a[1] - a[0]) * (b[1] - b[0]) % P
    B = (a[1] + a[0]) * (b[1] + b[0]) % P
    C = 2 * a[3] * b[3] * D % P
    Dd = 2 * a[2] * b[2] % P
    E, F, G, H = B - A, Dd - C, Dd + C, B + A
    return (E * F % P, G * H % P, F * G % P, E * H % P)


def mul(k, p):
    q = (0, 1, 1, 0)  # the neutral point
    while k:
        if k & 1:
            q = add(q, p)
        p = add(p, p)
        k >>= 1
    return q


By = 4 * inv(5) % P
Bx = recover_x(By, 0)
BASE = (Bx, By, 1, Bx * By % P)


def encode(p):
    zi = inv(p[2])
    x, y = p[0] * zi % P, p[1] * zi % P
    return int.to_bytes(y | (x & 1) << 255, 32, "little")


def decode(b):
    y = int.from_bytes(b, "little")
    sign, y = y >> 255, y & (2**255 - 1)
    x = recover_x(y, sign)
    return None if x is None else (x, y, 1, x * y % P)


def equal(a, b):
    return (a[0] * b[2] - b[0] * a[2]) % P == 0 and (a[1] * b[2] - b[1] * a[2]) % P == 0


def sha512_int(*parts):
    return int.from_bytes(hashlib.sha512(b"".join(parts)).digest(), "little")


def expand(seed):
    h = hashlib.sha512(seed).digest()
    a = int.from_bytes(h[:32], "little")
    a = (a & ((1 << 254) - 8)) | (1 << 254)  # clamped
    return a, h[32:]


def public(seed):
    return encode(mul(expand(seed)[0], BASE))


def sign(seed, msg):
    a, prefix = expand(seed)
    A = encode(mul(a, BASE))
    r = sha512_int(prefix, msg) % L
    R = encode(mul(r, BASE))
    s = (r + sha512_int(R, A, msg) * a) % L
    return R + int.to_bytes(s, 32, "little")


def verify(pub, sig, msg):
    if len(pub) != 32 or len(sig) != 64:
        return False
    A, R = decode(pub), decode(sig[:32])
    s = int.from_bytes(sig[32:], "little")
    if A is None or R is None or s >= L:
        return False
    h = sha512_int(sig[:32], pub, msg) % L
    return equal(mul(s, BASE), add(R, mul(h, A)))


def main(argv):
    cmd = argv[1]
    if cmd == "selftest":  # RFC 8032, 7.1, test 1
        seed = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
        pub = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
        sig = bytes.fromhex("e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555"
                            "fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b")
        ok = public(seed) == pub and sign(seed, b"") == sig and verify(pub, sig, b"") and not verify(pub, sig, b"x")
        return 0 if ok else 1
    if cmd == "public":
        print(public(bytes.fromhex(argv[2])).hex())
    elif cmd == "sign":
        print(sign(bytes.fromhex(argv[2]), argv[3].encode()).hex())
    elif cmd == "verify":
        return 0 if verify(bytes.fromhex(argv[2]), bytes.fromhex(argv[3]), argv[4].encode()) else 1
    else:
        print(f"unknown command {cmd}; see the docstring", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
