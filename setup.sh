#!/usr/bin/env bash
# Installs a pinned stack, as described in stacks/NAME.toml, with harness.stacks (standard library
# only, so it runs before any venv exists); for the default stack also the report tools.
#
#   ./setup.sh            install the default stack into .venv, or do nothing when it matches its pins
#   ./setup.sh --relock   resolve the default stack afresh and rewrite its lock (a hash per pin)
#   ./setup.sh --stack NAME [--relock]   install the pinned stack stacks/NAME.toml into its own venv
#   ./setup.sh --stack A,B,C   install several stacks side by side (each into its own venv, each
#                         logged to .hil-cache/setup-NAME.log; the default one with the report tools)
#   ./setup.sh [--stack NAME] --venv DIR  install into DIR instead (to try a stack)
#
# Every step names itself; the first failing step stops the script with its name.
set -euo pipefail

cd "$(dirname "$0")"
ROOT=$(pwd)

step=""
trap 'rc=$?; [ $rc -ne 0 ] && echo "setup.sh: FAILED at step: $step (exit $rc)" >&2' EXIT
run_step() { step="$1"; echo "==> $1"; }

opts=()
stack="default"
want=""
for arg in "$@"; do
  if [ -n "$want" ]; then
    if [ "$want" = stack ]; then stack="$arg"; else opts+=(--venv "$arg"); fi
    want=""; continue
  fi
  case "$arg" in
    --relock) opts+=(--relock) ;;
    --stack|--venv) want="${arg#--}" ;;
    --stack=*) stack="${arg#--stack=}" ;;
    --venv=*) opts+=(--venv "${arg#--venv=}") ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument: $arg (known: --relock, --stack NAME, --venv DIR)" >&2; exit 2 ;;
  esac
done
[ -z "$want" ] || { echo "setup.sh: --$want needs a value" >&2; exit 2; }

run_step "find Python 3.11"
PY=""
for cand in "${HIL_PYTHON:-}" python3.11 python3; do
  [ -n "$cand" ] || continue
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    PY=$(command -v "$cand"); break
  fi
done
[ -n "$PY" ] || { echo "no Python 3.11 found (tried \$HIL_PYTHON, python3.11, python3); install it or set HIL_PYTHON" >&2; exit 1; }

if [[ "$stack" == *,* ]]; then
  # Several stacks: installs are mostly downloads and file copies, so they run side by side;
  # each logs to its own file, and the first that fails is named with its log's end.
  [ ${#opts[@]} -eq 0 ] || { echo "setup.sh: --relock and --venv take one --stack, not a list" >&2; exit 2; }
  mkdir -p "$ROOT/.hil-cache"
  IFS=, read -r -a stacks <<< "$stack"
  pids=()
  for s in "${stacks[@]}"; do
    [ -n "$s" ] || { echo "setup.sh: --stack $stack names an empty stack" >&2; exit 2; }
    echo "==> install stack $s (python -m harness.stacks; log: .hil-cache/setup-$s.log)"
    args=("$0" --stack "$s")
    "${args[@]}" > "$ROOT/.hil-cache/setup-$s.log" 2>&1 &
    pids+=($!)
  done
  failed=""
  for i in "${!stacks[@]}"; do
    if ! wait "${pids[$i]}"; then
      failed="$failed ${stacks[$i]}"
      echo "setup.sh: stack ${stacks[$i]} FAILED; the end of .hil-cache/setup-${stacks[$i]}.log:" >&2
      tail -n 30 "$ROOT/.hil-cache/setup-${stacks[$i]}.log" >&2
    else
      tail -n 1 "$ROOT/.hil-cache/setup-${stacks[$i]}.log"
    fi
  done
  step="install stacks:$failed"
  [ -z "$failed" ] || exit 1
  step="done"
  exit 0
fi

run_step "install stack $stack (python -m harness.stacks, from stacks/$stack.toml)"
"$PY" -m harness.stacks install "$stack" ${opts[@]+"${opts[@]}"}
[ "$stack" = default ] || exit 0

# The report tools (hil report, and its browser test): the pinned Allure 2 command line
# from tools/report/package-lock.json, and Java, Chromium and chromedriver from Debian
# (tools/report/apt-packages.txt) where the command is missing. Cheap when all are there.
REPORT="$ROOT/tools/report"
lock_sum=$(sha256sum "$REPORT/package-lock.json" | cut -c1-16)
if [ -x "$REPORT/node_modules/.bin/allure" ] && [ "$(cat "$REPORT/node_modules/.hil-stamp" 2>/dev/null)" = "$lock_sum" ]; then
  echo "==> report tool (allure-commandline, tools/report) is up to date"
else
  run_step "install the report tool: npm ci in tools/report (allure-commandline, pinned)"
  command -v npm >/dev/null 2>&1 || { echo "npm not found: install Node.js 18+ and npm, then rerun ./setup.sh" >&2; exit 1; }
  (cd "$REPORT" && ALLURE_NO_ANALYTICS=true npm ci --no-audit --no-fund --loglevel=error)
  echo "$lock_sum" > "$REPORT/node_modules/.hil-stamp"
fi
missing=()
while read -r cmd pkg; do
  case "$cmd" in ''|'#'*) continue ;; esac
  command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
done < "$REPORT/apt-packages.txt"
if [ ${#missing[@]} -eq 0 ]; then
  echo "==> report tools java, chromium, chromedriver are installed"
elif [ "$(id -u)" != 0 ]; then
  echo "setup.sh: not root; run: sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
  echo "setup.sh: until then hil report (java) or its browser test (chromium) cannot run" >&2
else
  run_step "install Debian packages for the report: ${missing[*]}"
  apt-get update -qq
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
    # Debian replaces security builds (chromium, openjdk) in place; an old pin can vanish.
    echo "setup.sh: WARNING: pinned versions unavailable (${missing[*]}); installing Debian's current ones;" \
         "update tools/report/apt-packages.txt" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]%%=*}"
  fi
fi
step="done"
echo "==> setup complete (stack $stack)"
