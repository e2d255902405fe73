# Shared helpers for the scripts in this folder (sourced, not run).

log() { printf '%s: %s\n' "${LOG_NAME:-scripts}" "$*" >&2; }
die() { log "error: $*"; exit 1; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    die "need root to run: $* (install it by hand, or run as root)"
  fi
}

# apt_install PACKAGE... — Debian packages, without recommends, quietly.
apt_install() {
  log "installing Debian packages: $*"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
