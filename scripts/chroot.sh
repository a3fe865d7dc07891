#!/usr/bin/env bash
# A Debian chroot to run fragscope under another release's programs (its CPython, its
# glibc), made with debootstrap and reused when it exists.
#
#   scripts/chroot.sh SUITE DIR [PACKAGES...]   make DIR (minbase SUITE) or reuse it; install PACKAGES
#   scripts/chroot.sh run DIR COMMAND...        run COMMAND inside DIR (chroot DIR COMMAND...)
#   scripts/chroot.sh unmount DIR               take down the mounts an interrupted run left
#
# Inside, /proc is the kernel's and /dev the host's, bound privately (so that taking it
# down never reaches the host's own /dev/pts or /dev/shm), with a /dev/shm of its own.
# $FRAGSCOPE_CHROOT_BIND (host directories, space-separated) are bound at the same paths
# inside, so that a test built on the host runs there as it was built (its paths baked in).
# The mounts of `run` are made in a mount namespace of its own (unshare), so they last as
# long as the command, and two runs in one chroot at once never take down each other's.
# The mirror is the host's (the first Debian URI of its apt sources), or $MIRROR. Needs
# root.
set -euo pipefail

die() { echo "chroot.sh: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || die "needs root (debootstrap, mount, chroot)"

# The mounts under DIR, deepest first.
mounts_under() {
  local dir
  dir=$(realpath -m "$1")
  findmnt -rn -o TARGET | awk -v d="$dir" '$0 == d || index($0, d "/") == 1' | sort -r
}

unmount_all() {
  local m
  while read -r m; do
    [[ -n "$m" ]] && umount -l "$m"
  done < <(mounts_under "$1")
  return 0
}

mount_all() {
  local dir=$1
  mountpoint -q "$dir/proc" || mount -t proc proc "$dir/proc"
  if ! mountpoint -q "$dir/dev"; then
    mount --rbind /dev "$dir/dev"
    mount --make-rprivate "$dir/dev"
  fi
  if ! findmnt -rn -o SOURCE "$dir/dev/shm" | grep -qx chroot-shm; then
    mkdir -p "$dir/dev/shm"
    mount -t tmpfs -o mode=1777 chroot-shm "$dir/dev/shm"
  fi
  local host
  for host in ${FRAGSCOPE_CHROOT_BIND:-}; do
    [[ -d "$host" ]] || die "FRAGSCOPE_CHROOT_BIND: $host is not a directory"
    mkdir -p "$dir$host"
    if ! mountpoint -q "$dir$host"; then
      mount --bind "$host" "$dir$host"
      mount --make-private "$dir$host"
    fi
  done
}

host_mirror() {
  local uri
  uri=$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/* \
        | grep -oE 'https?://[^ ]+' | grep -v security | grep -E '/debian/?$' | head -1 || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

installed() {
  chroot "$1" dpkg-query -W -f='${Status}' "$2" 2>/dev/null | grep -q "install ok installed"
}

case "${1:-}" in
  "" | -h | --help)
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  unmount)
    [[ $# -eq 2 ]] || die "usage: chroot.sh unmount DIR"
    unmount_all "$2"
    exit 0
    ;;
  run)
    [[ $# -ge 3 ]] || die "usage: chroot.sh run DIR COMMAND..."
    if [[ -z ${FRAGSCOPE_CHROOT_NAMESPACE:-} ]]; then
      FRAGSCOPE_CHROOT_NAMESPACE=1 exec unshare --mount --propagation private "$0" "$@"
    fi
    dir=$2
    shift 2
    [[ -x "$dir/usr/bin/apt-get" ]] || die "$dir is not a chroot made by chroot.sh"
    trap 'unmount_all "$dir"' EXIT
    mount_all "$dir"
    status=0
    chroot "$dir" /usr/bin/env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 \
      "$@" || status=$?
    exit "$status"
    ;;
esac

[[ $# -ge 2 ]] || die "usage: chroot.sh SUITE DIR [PACKAGES...]"
suite=$1
dir=$2
shift 2
mirror=${MIRROR:-$(host_mirror)}

if ! command -v debootstrap >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

trap 'unmount_all "$dir"' EXIT
# debootstrap removes DIR/debootstrap when it succeeds: one left there was cut short.
if [[ -d "$dir/debootstrap" ]]; then
  echo "chroot.sh: $dir holds an unfinished debootstrap; starting again" >&2
  unmount_all "$dir"
  [[ -z $(mounts_under "$dir") ]] || die "$dir still has mounts; not removing it"
  rm -rf --one-file-system "$dir"
fi
if [[ ! -x "$dir/usr/bin/apt-get" ]]; then
  mkdir -p "$dir"
  echo "chroot.sh: debootstrap $suite into $dir from $mirror" >&2
  debootstrap --variant=minbase "$suite" "$dir" "$mirror" >"$dir.debootstrap.log" 2>&1 \
    || { tail -20 "$dir.debootstrap.log" >&2; die "debootstrap $suite failed (log: $dir.debootstrap.log)"; }
fi
# Unstable's Release files can outlive their Valid-Until on a mirror that snapshots them.
case "$suite" in
  sid | unstable) echo 'Acquire::Check-Valid-Until "false";' >"$dir/etc/apt/apt.conf.d/99no-valid-until" ;;
esac

missing=()
for p in "$@"; do
  installed "$dir" "$p" || missing+=("$p")
done
if ((${#missing[@]})); then
  mount_all "$dir"
  echo "chroot.sh: installing into $dir: ${missing[*]}" >&2
  chroot "$dir" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin apt-get update -qq
  chroot "$dir" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes \
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
