# Shared by the bench scripts (source it).

# ensure_torch WHO: Debian's python3-torch (the PyTorch peers) installed if missing, idempotently; non-zero
# when it cannot be (the reason in /tmp/forge-WHO-torch.log).
ensure_torch() {
  local who=$1 sudo=""
  dpkg-query -W -f='${Status}' python3-torch 2>/dev/null | grep -q '^install ok installed$' && return 0
  echo "$who: installing python3-torch (the PyTorch peer)"
  if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi
  if ! { $sudo apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-torch; } \
    >"/tmp/forge-$who-torch.log" 2>&1; then
    echo "$who: could not install python3-torch (see /tmp/forge-$who-torch.log)" >&2
    return 1
  fi
}
