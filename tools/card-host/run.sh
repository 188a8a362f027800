#!/usr/bin/env bash
# The emulated card host, as CI runs it (no card on this machine):
#  1. a "card image": a venv whose site-packages already hold the stack (a .pth onto the default
#     stack's site-packages, as a vendor base image with system site packages would), plus the
#     emulated torch_sendnn (emulation/torch_sendnn);
#  2. the harness pip-installed into it, non-editable, from a copy of this checkout's files (its
#     suites land in the image's share/vllm-hil/suites);
#  3. a fake device tree with two Spyre cards (PCI 1014:06a7, VFIO groups) and an inventory
#     (HIL_CARD_HOST_CARDS=N cards instead, HIL_CARD_HOST_GROUP=N declares a group of the
#     first N cards that a tensor-parallel engine leases whole);
#  4. the README's card-host commands, run from another folder: `hil devices --inventory ...`,
#     then `hil suites -m spyre --inventory ... --require-device --allow-emulated-card` (the
#     installed suites, as the README gives them, with the emulated runtime allowed):
#     discovery, leases, card env, one engine per card, the on-card verification, every card
#     suite, no skip allowed.
# Everything lands in $HIL_CARD_HOST_DIR (default .hil-cache/card-host, git-ignored); steps 1-3
# are redone only when their inputs changed. The host's cache (models, references, tokenizer
# answers: all keyed by content and stack) is $HIL_CARD_HOST_CACHE_DIR, default its own folder
# there; a lab's shared cache, or the checkout's, serves as well. Extra arguments go to pytest
# (a selection, faults).
#
#   tools/card-host/run.sh                        # the selection CI runs
#   tools/card-host/run.sh -k 'token' --inject-fault perturb-logit
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${HIL_CARD_HOST_DIR:-$REPO/.hil-cache/card-host}
BASE_PY=${HIL_CARD_HOST_BASE_PYTHON:-$REPO/.venv/bin/python}
IMAGE=$WORK/image
PY=$IMAGE/bin/python
mkdir -p "$WORK"
t0=$(date +%s)

# The checkout's files under the given paths as the work tree has them (tracked and new; a
# tracked file deleted or moved but not yet committed is left out).
tree_files() {
  (cd "$REPO" && git ls-files -co --exclude-standard -- "$@" \
     | while IFS= read -r f; do [ -e "$f" ] && printf '%s\n' "$f"; done)
}

# 1+2. The card image, rebuilt when the harness's or the emulation's files change.
stamp=$(cd "$REPO" && tree_files harness fixtures suites emulation pyproject.toml \
        | sort | xargs sha256sum | sha256sum | cut -c1-16)
if [ "$(cat "$IMAGE/.card-image-stamp" 2>/dev/null)" != "$stamp" ]; then
  echo "card-host: building the card image in $IMAGE" >&2
  rm -rf "$IMAGE" "$WORK/src"
  base_site=$("$BASE_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  base_ver=$("$BASE_PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  "$BASE_PY" -m venv --without-pip "$IMAGE"
  site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$base_site" > "$site/card-image-base.pth"   # the image's preinstalled stack
  # the stack is there before the harness: vLLM and a Spyre plugin of either generation
  "$PY" -c 'import importlib.util as u, vllm, torch, pip; assert u.find_spec("sendnn_inference") or u.find_spec("vllm_spyre"), "no Spyre plugin in the base stack"'
  mkdir -p "$WORK/src"
  (cd "$REPO" && tree_files harness fixtures suites emulation pyproject.toml README.md \
     | tar -cf - -T -) | tar -C "$WORK/src" -xf -
  pipi() { "$PY" -m pip --disable-pip-version-check -q install --no-deps --no-build-isolation --no-index "$@"; }
  pipi "$WORK/src/emulation/torch_sendnn"   # the vendor runtime, emulated
  pipi "$WORK/src"                          # the harness, as a lab installs it
  echo "$stamp" > "$IMAGE/.card-image-stamp"
  echo "card-host: image built (python $base_ver) in $(( $(date +%s) - t0 )) s" >&2
fi

# 3. The fake host: two cards (or HIL_CARD_HOST_CARDS) and the lab's inventory.
rm -rf "$WORK/host-root"
"$PY" "$REPO/tools/card-host/fake_device_tree.py" "$WORK/host-root" --cards "${HIL_CARD_HOST_CARDS:-2}" \
  --group "${HIL_CARD_HOST_GROUP:-0}" --inventory "$WORK/inventory.toml" >/dev/null

# 4. Run from another folder: the installed suites (hil suites), outputs in that folder, configured
#    by its pytest.ini.
RUN=${HIL_CARD_HOST_RUN_DIR:-$WORK/run}
rm -rf "$RUN/suites" "$RUN/reports" "$RUN/leases"
mkdir -p "$RUN"
cat > "$RUN/pytest.ini" <<'INI'
[pytest]
addopts = --strict-markers -ra -p no:cacheprovider
timeout = 1800
timeout_method = signal
filterwarnings =
    ignore::DeprecationWarning
    ignore::FutureWarning
INI
cd "$RUN"
export HIL_DEVICE_ROOT=$WORK/host-root SENDNN_EMULATION_ROOT=$WORK/host-root
export HIL_INVENTORY=$WORK/inventory.toml HIL_LEASE_DIR=$RUN/leases HIL_CACHE_DIR=${HIL_CARD_HOST_CACHE_DIR:-$WORK/cache}
# A yes/no variable, read as the harness reads them (harness/core/settings/values.py).
case "${HIL_CARD_HOST_NO_DEVICES_CHECK:-0}" in
  [0]|[Ff][Aa][Ll][Ss][Ee]|[Nn][Oo]|[Oo][Ff][Ff]) "$IMAGE/bin/hil" devices --inventory "$HIL_INVENTORY" ;;
  [1]|[Tt][Rr][Uu][Ee]|[Yy][Ee][Ss]|[Oo][Nn]) ;;
  *) echo "run.sh: HIL_CARD_HOST_NO_DEVICES_CHECK='$HIL_CARD_HOST_NO_DEVICES_CHECK': expected one of" \
          "1, true, yes, on, 0, false, no, off" >&2; exit 2 ;;
esac
# The smallest selection that runs every card suite on every card mode (14 tests on sendnn-inference
# 2.x, 17 on vllm-spyre 1.x), on two workers: one per card, each engine in a shape a card compiles.
if [ $# -eq 0 ]; then
  set -- -k "(token_equality and pair) or 64-4 or after_warmup or back-to-idle or capacity" \
         -n "${HIL_CARD_HOST_WORKERS:-2}"
fi
# The order of tests by engine configuration comes from a plan-only pass (no engine starts), in
# one process (`-n 0` last: the workers of the selection's `-n` would only collect, 1.5 s more).
"$IMAGE/bin/hil" suites -m spyre --inventory "$HIL_INVENTORY" --allow-emulated-card --stack host \
  --model tiny-llama -q --hil-plan "$@" -n 0 >/dev/null || true
rc=0
# The runtime here is the emulated torch_sendnn: the run says so, and each result is marked.
"$IMAGE/bin/hil" suites -m spyre --inventory "$HIL_INVENTORY" --require-device --allow-emulated-card \
  --alluredir "$RUN/reports/allure-results" --stack host --model tiny-llama \
  --junitxml="$RUN/reports/junit.xml" "$@" || rc=$?
echo "card-host: wall time $(( $(date +%s) - t0 )) s (rc=$rc)" >&2
exit $rc
