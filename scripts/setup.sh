#!/usr/bin/env bash
# One-shot, idempotent set-up for a fresh Debian 12 or Ubuntu 24.04 machine (run as root):
#   1. apt packages (Mininet, Open vSwitch, tools),
#   2. a virtual environment at .venv/ that also sees Debian's mininet package,
#   3. the project and its Python dependencies installed into it, PyTorch's CPU build included
#      (the `torch` extra; torch jobs on the rails), and TorchTitan (the `torchtitan` extra:
#      torchtitan==0.3.0, the version testbed/torchjob/titan_compat.py is pinned to; no triton;
#      about 470 MB and 25 s), its tokenizer and corpus built in ~/.cache/opus-testbed,
#   4. Open vSwitch started when it is not running (no systemd needed),
#   5. `opus-testbed` on the PATH of every new shell: a link in /usr/local/bin to the venv's
#      entry point (scripts/link-cli.sh),
#   6. the test tools apt may lack: Vagrant and its libvirt plugin (Debian 12: vagrant 2.3.4,
#      vagrant-libvirt 0.11.2: 72 packages, 16.5 MB, 11 s on 2026-12-07), so that
#      tests/testbed/test_vagrant.py runs `vagrant validate`; where apt has no candidate the
#      step says so and goes on, and that test skips.
# Each step is skipped when already done, so `make test` and `make demo` can call it every time.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(mininet python3-setuptools openvswitch-switch openvswitch-common ethtool iproute2 iputils-ping
              iperf3 tcpdump procps python3-venv python3-dev python3-pip make git)
# Test-only; optional: installed when apt offers them (not every release ships Vagrant).
TEST_APT_PACKAGES=(vagrant vagrant-libvirt)
VENV=.venv
PY=/usr/bin/python3
TORCH_VERSION=2.13.0

log() { printf '[setup] %s\n' "$*"; }

need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "[setup] error: must run as root (apt, Open vSwitch and Mininet need it); try: sudo $0" >&2
    exit 1
  fi
}

install_apt() {
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then log "apt packages present"; return; fi
  need_root
  log "installing apt packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Whether apt can install package $1 (a candidate version exists).
apt_candidate() {
  local cand
  cand=$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}')
  [ -n "$cand" ] && [ "$cand" != "(none)" ]
}

install_test_tools() {
  local missing=() unavailable=() p
  for p in "${TEST_APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then log "test tools present (${TEST_APT_PACKAGES[*]})"; return; fi
  need_root
  if ! apt_candidate "${missing[0]}"; then apt-get update -qq || true; fi
  local installable=()
  for p in "${missing[@]}"; do
    if apt_candidate "$p"; then installable+=("$p"); else unavailable+=("$p"); fi
  done
  if [ ${#installable[@]} -gt 0 ]; then
    log "installing test tools: ${installable[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${installable[@]}" >/dev/null || unavailable+=("${installable[@]}")
  fi
  if [ ${#unavailable[@]} -gt 0 ]; then
    log "apt cannot install ${unavailable[*]} here; tests/testbed/test_vagrant.py will skip" \
        "\`vagrant validate\`"
  fi
}

make_venv() {
  if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV (with system site packages, for Debian's mininet)"
    "$PY" -m venv --system-site-packages "$VENV"
  fi
  # the stamp changes with the dependencies or with the install line below
  local stamp="$VENV/.installed-$(cat pyproject.toml scripts/setup.sh | sha1sum | cut -c1-12)"
  if [ ! -f "$stamp" ]; then
    install_torch
    log "installing the project and its Python dependencies into $VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[dev,dask,torch,torchtitan]'
    rm -f "$VENV"/.installed-* && touch "$stamp"
  else
    log "python dependencies present"
  fi
}

# PyPI's Linux torch wheel is the CUDA build (several GB with its libraries). The CPU build is
# taken from a wheel pip already sees (a local wheel directory in PIP_FIND_LINKS), else from
# PyTorch's CPU index (OPUS_TORCH_INDEX overrides it; empty: PyPI alone). torch==X also accepts
# the CPU build X+cpu, so the project's `torch` extra then installs nothing more.
install_torch() {
  local have
  have=$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('torch'))" \
         2>/dev/null || true)
  if [ "${have%%+*}" = "$TORCH_VERSION" ]; then log "torch $have present"; return; fi
  local local_build index_args=()
  local_build=$("$VENV/bin/python" -m pip install -q --disable-pip-version-check --dry-run \
                --no-index --no-deps --ignore-installed --report - "torch==$TORCH_VERSION" \
                2>/dev/null | "$VENV/bin/python" -c \
                'import json, sys; print(json.load(sys.stdin)["install"][0]["metadata"]["version"])' \
                2>/dev/null || true)
  local index="${OPUS_TORCH_INDEX-https://download.pytorch.org/whl/cpu}"
  if [[ "$local_build" != *+cpu && -n "$index" ]]; then index_args=(--extra-index-url "$index"); fi
  log "installing torch $TORCH_VERSION, CPU build, from ${index_args[1]:-the local wheel $local_build}"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${index_args[@]}" \
    "torch==$TORCH_VERSION"
}

start_ovs() {
  if ovs-vsctl --timeout=5 show >/dev/null 2>&1; then log "Open vSwitch running"; return; fi
  need_root
  log "starting Open vSwitch"
  /usr/share/openvswitch/scripts/ovs-ctl start --system-id=random >/dev/null 2>&1 \
    || /usr/share/openvswitch/scripts/ovs-ctl start --system-id=random
  ovs-vsctl --timeout=10 show >/dev/null
}

# TorchTitan's tokenizer and corpus, made from local text (testbed/torchjob/titan_assets.py);
# a no-op once built. Owned by the invoking user's cache (root's under sudo, as the runs).
build_titan_assets() {
  "$VENV/bin/python" -m testbed.torchjob.titan_assets >/dev/null && log "TorchTitan assets present"
}

install_apt
if [ "${OPUS_SKIP_TEST_TOOLS:-0}" != "1" ]; then install_test_tools; fi
make_venv
build_titan_assets
if [ "${OPUS_SKIP_OVS:-0}" != "1" ]; then start_ovs; fi
bash scripts/link-cli.sh "$PWD/$VENV/bin/opus-testbed"
log "ready: opus-testbed ($VENV/bin/opus-testbed)"
