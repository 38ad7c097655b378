#!/usr/bin/env bash
# The Chromium that the demo's browser test and docs/take_demo_screenshots.py drive; the demo itself needs none,
# so scripts/setup.sh does not install it. Prints the browser's path on stdout (progress goes to stderr):
#   1. $DSPARK_CHROMIUM, when set: the user's choice, and the only one tried;
#   2. one already there: Playwright's own build, or Debian's /usr/bin/chromium;
#   3. else Playwright's download (python -m playwright install chromium), where the network allows it;
#   4. else Debian's chromium with apt-get, when run as root (waiting for a dpkg lock held by another install).
# Otherwise it exits 1 with one line saying why, which the browser tests show as their reason to skip.
set -uo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-.venv/bin/python}"
step() { echo "[setup_browser] $*" >&2; }
fail() { echo "no Chromium for the browser tests: $*" >&2; exit 1; }

if [ -n "${DSPARK_CHROMIUM:-}" ]; then
    [ -x "$DSPARK_CHROMIUM" ] || fail "DSPARK_CHROMIUM=$DSPARK_CHROMIUM is not an executable file; unset it or fix the path."
    echo "$DSPARK_CHROMIUM"
    exit 0
fi

found() {
    local playwright_build
    playwright_build="$("$python" -c 'from playwright.sync_api import sync_playwright
with sync_playwright() as p: print(p.chromium.executable_path)' 2>/dev/null)"
    for candidate in "$playwright_build" /usr/bin/chromium /usr/bin/chromium-browser; do
        if [ -n "$candidate" ] && [ -x "$candidate" ]; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

found && exit 0
# The installers' own output (Node stack traces on every retry offline, apt's unpacking) goes to a log;
# the terminal gets one line per step and, on failure, the first error line.
log="$(mktemp "${TMPDIR:-/tmp}/dspark-setup-browser.XXXXXX")"
first_error() { grep -m1 -iE "^(error|e):" "$log" || tail -n1 "$log"; }
step "downloading Playwright's Chromium (log: $log)"
timeout 600 "$python" -m playwright install chromium >"$log" 2>&1 && found && exit 0
step "Playwright's download failed: $(first_error)"
if [ "$(id -u)" != 0 ]; then
    fail "Playwright's download failed and apt-get needs root; run 'python -m playwright install chromium' where the network allows, install chromium as root, or set DSPARK_CHROMIUM=/path/to/chromium."
fi
command -v apt-get >/dev/null || fail "Playwright's download failed and there is no apt-get; set DSPARK_CHROMIUM=/path/to/chromium."
step "installing Debian's chromium with apt-get (log: $log)"
apt() { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 "$@" >>"$log" 2>&1; }
apt update -qq && apt install -y -qq chromium && found && exit 0
fail "Playwright's download and 'apt-get install chromium' both failed (log: $log); set DSPARK_CHROMIUM=/path/to/chromium."
