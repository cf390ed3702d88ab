#!/usr/bin/env bash
# bundle_check.sh — does every binary of the GPU bundle find its libraries on this machine, inside
# the bundle or among those host_libs.txt says the machine provides? For each ELF file of bin/,
# tests/, mpi/ and lib/ (the compressed libraries unpacked, bundle_env.sh), every line of `ldd` must
# resolve to a file inside the bundle (or its unpacked cache), or to a library named in
# host_libs.txt; and the newest glibc symbol version the files ask for must be no newer than this
# machine's glibc. Prints one line per problem and a last line; exit 1 on any problem.
#   bash bundle_check.sh            (from the bundle folder, or: bash path/to/bundle/bundle_check.sh)
set -u
unset LD_PRELOAD  # (stdbuf's: ldd would list its library with every binary's)
dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$dir/bundle_env.sh"
if ! bundle_env "$dir"; then
  echo "bundle_check: FAIL: $bundle_problem"
  exit 1
fi
allowed=$(grep -v '^#' "$dir/host_libs.txt" | awk 'NF {print $1}')
problems=0 files=0 need_glibc=0.0
for f in "$dir"/bin/* "$dir"/tests/* "$dir"/mpi/* "$dir"/lib/* "$NZ_BUNDLE_CACHE"/*; do
  [ -f "$f" ] && [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
  files=$((files + 1))
  while read -r line; do
    name=${line%% *}
    case "$line" in
      *"=> not found"*) echo "bundle_check: ${f#$dir/}: $name not found (expected in the bundle's lib/ or on this machine: see host_libs.txt)"
                        problems=$((problems + 1)); continue ;;
      *" => "*) path=$(awk '{print $3}' <<<"$line") ;;
      *) path=${name} ;;  # the loader itself, or the kernel's vdso
    esac
    case "$path" in "$dir"/* | "$NZ_BUNDLE_CACHE"/*) continue ;; esac
    grep -qxF "${name##*/}" <<<"$allowed" && continue
    echo "bundle_check: ${f#$dir/}: $name resolves to $path, outside the bundle and not in host_libs.txt"
    problems=$((problems + 1))
  done < <(ldd "$f" 2>&1 | sed 's/^[[:space:]]*//' | grep -v -e '^statically linked' -e '^not a dynamic')
  # The project's programs carry their own C++ runtime (-static-libstdc++) and must export none of it:
  # NCCL and cuBLAS load the machine's libstdc++.so.6, and an exported facet id (a GNU unique symbol)
  # binds that library to the program's copy, of another version: every std::ostringstream of the
  # program then writes nothing (seen on a GPU machine: the memory table's rows went missing).
  case "${f#$dir/}" in
    bin/* | tests/*)
      n=$(objdump -T "$f" 2>/dev/null | grep -v '\*UND\*' | awk '{print $NF}' | grep -c -E '^_ZN(St|Kt|Ss|Sb)?.*(2idE|6locale)')
      if [ "$n" -gt 0 ]; then
        echo "bundle_check: ${f#$dir/} exports $n locale symbols of the C++ runtime it carries (expected none: link with -Wl,--exclude-libs,ALL)"
        problems=$((problems + 1))
      fi ;;
  esac
  v=$(objdump -T "$f" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)
  [ -n "$v" ] && need_glibc=$(printf '%s\n%s\n' "$need_glibc" "$v" | sort -V | tail -1)
done
have_glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
if [ -n "$have_glibc" ] && [ "$(printf '%s\n%s\n' "$need_glibc" "$have_glibc" | sort -V | tail -1)" != "$have_glibc" ]; then
  echo "bundle_check: the bundle needs glibc $need_glibc, this machine has $have_glibc: rebuild the bundle on an older distribution"
  problems=$((problems + 1))
fi
[ $files -gt 0 ] || { echo "bundle_check: no binary in $dir"; problems=$((problems + 1)); }
host=$(printf '%s' "$bundle_lib_dirs" | tr '\n' ' ')
if [ $problems = 0 ]; then
  echo "bundle_check: OK: $files binaries and libraries resolve in the bundle or to host_libs.txt; glibc $need_glibc needed, ${have_glibc:-?} here; host libraries: ${host:-none found}"
else
  echo "bundle_check: FAIL: $problems problem(s) in $files files"
  exit 1
fi
