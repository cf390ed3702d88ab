#!/usr/bin/env bash
# pristine_check.sh — make pristine-check: the README's two commands, as a new user meets them, on a
# pristine Debian 12 root: built with mmdebstrap holding only make and git (and the certificates git
# and pip need), the repository's committed HEAD cloned into it, and `make run`, then `make test`,
# run there as root with a clean environment. Only the package sources this machine uses are passed
# through (its apt sources and their Acquire:: settings, its pip configuration, the certificate
# authorities it adds in /usr/local/share/ca-certificates); there is no CUDA
# toolkit, no MPI, nothing installed by hand. Prints each command's result and time, and exits
# non-zero if either fails. The root's mounts are removed on every exit path (a failure, Ctrl-C, a
# kill), and the root with them unless PRISTINE_KEEP=1.
#   PRISTINE_DIR=DIR   where the root goes (default: a new folder under /tmp)
#   PRISTINE_SUITE=S   the distribution (default bookworm: Debian 12, as the README names it)
# Not part of make test: it takes about as long as `make run` and `make test` together, plus the
# root (about 2 minutes). Run it before a stop when the install step, the Makefile or a test's
# environment changed.
set -u
cd "$(dirname "$0")/.." || exit 1
repo=$(pwd)
suite=${PRISTINE_SUITE:-bookworm}

die() { echo "pristine-check: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "must run as root (it builds a root file system and mounts into it): sudo make pristine-check"
git rev-parse --verify -q HEAD >/dev/null || die "$repo is not a git repository with a commit: the check clones the committed HEAD"
if ! command -v mmdebstrap >/dev/null 2>&1; then
  echo "pristine-check: installing mmdebstrap"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null; } ||
    die "mmdebstrap did not install; expected Debian's mmdebstrap package: apt-get install mmdebstrap"
fi

root=${PRISTINE_DIR:-$(mktemp -d /tmp/nanozero-pristine.XXXXXX)}
[ -d "$root" ] && [ -n "$(ls -A "$root" 2>/dev/null)" ] && die "$root exists and is not empty; expected a new or empty folder (PRISTINE_DIR)"
mkdir -p "$root" || die "cannot create $root"

mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null; done
  mounted=()
  if [ "${PRISTINE_KEEP:-}" = 1 ]; then echo "pristine-check: the root stays in $root (PRISTINE_KEEP=1)"
  else rm -rf --one-file-system "$root"; fi
}
trap cleanup EXIT
trap 'echo "pristine-check: interrupted"; exit 130' INT TERM HUP

# ---- the root: the machine's package sources, make and git ----
sources=()
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [ -s "$f" ] && grep -q '^[^#]' "$f" && sources+=("$f")
done
aptopts=()
for f in /etc/apt/apt.conf.d/*; do
  [ -f "$f" ] && grep -q '^[[:space:]]*Acquire::' "$f" && aptopts+=(--aptopt="$f")
done
t=$SECONDS
echo "pristine-check: building a $suite root in $root (make, git, ca-certificates; sources: ${sources[*]:-the default mirror})"
if ! mmdebstrap --variant=minbase --include=make,git,ca-certificates "${aptopts[@]}" "$suite" "$root" "${sources[@]}" \
     >"$root.mmdebstrap.log" 2>&1; then
  tail -5 "$root.mmdebstrap.log"
  rm -f "$root.mmdebstrap.log"
  die "mmdebstrap failed (above); expected a $suite root from this machine's apt sources"
fi
rm -f "$root.mmdebstrap.log"
echo "pristine-check: root ready in $((SECONDS - t)) s"
# what the root's programs need of the machine: names (MPI's launcher resolves its own host name),
# the name servers, pip's configuration (its certificates), and the kernel's file systems
cp /etc/resolv.conf "$root/etc/resolv.conf"
cp /etc/hosts "$root/etc/hosts"
echo "$(hostname)" >"$root/etc/hostname"
[ -f /etc/pip.conf ] && cp /etc/pip.conf "$root/etc/pip.conf"
# the certificate authorities this machine adds to reach its mirrors (a proxy's, say): trusted there too
if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >/dev/null 2>&1 || die "update-ca-certificates failed in the root"
fi
for m in proc sys dev dev/pts; do
  mkdir -p "$root/$m"
  case $m in
    proc) mount -t proc proc "$root/proc" ;;
    *) mount --rbind "/$m" "$root/$m" && mount --make-rslave "$root/$m" ;;
  esac || die "cannot mount /$m into the root"
  mounted+=("$root/$m")
done
mkdir -p "$root/dev/shm"
mount -t tmpfs -o mode=1777 shm "$root/dev/shm" && mounted+=("$root/dev/shm")

git clone -q "$repo" "$root/root/nanozero" || die "cannot clone $repo into the root"
echo "pristine-check: cloned $(git -C "$root/root/nanozero" log -1 --format='%h %s' | cut -c1-80)"

# ---- the README's two commands, as root, in a clean environment ----
in_root() {  # command -> exit status; output in $root/root/<log>
  env -i HOME=/root LANG=C.UTF-8 TERM=dumb PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    chroot "$root" bash -c "cd /root/nanozero && $1" </dev/null
}
status=0
for cmd in "make run" "make test"; do
  log=$root/root/${cmd// /-}.log
  t=$SECONDS
  in_root "$cmd" >"$log" 2>&1
  rc=$?
  secs=$((SECONDS - t))
  last=$(grep -v '^[[:space:]]*$' "$log" | tail -1 | cut -c1-120)
  if [ $rc = 0 ]; then echo "pristine-check: PASS $cmd in $secs s ($last)"
  else
    echo "pristine-check: FAIL $cmd: exit $rc after $secs s; its last lines:"
    tail -15 "$log" | sed 's/^/    /'
    status=1
  fi
  [ "$cmd" = "make test" ] && sed -n '/^failures (logs in/,/^$/p' "$log" | sed 's/^/    /'
done
[ $status = 0 ] && echo "pristine-check: both commands passed on a pristine $suite root"
exit $status
