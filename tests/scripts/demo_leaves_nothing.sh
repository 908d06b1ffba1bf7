#!/usr/bin/env bash
# scripts/demo must leave nothing running (without a terminal it exited and left both replicas
# and the router running). Runs the demo in a session of its own on the built binaries, with
# KVFLEET_DEMO_EXIT=1 and no terminal, then looks for any process still in that session; survivors are
# killed and the test fails. Usage: demo_leaves_nothing.sh BIN_DIR
set -euo pipefail
bin=$(cd "$1" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
timeout 240 setsid -w bash -c 'echo $$ >"$0"; KVFLEET_DEMO_EXIT=1 KVFLEET_DEMO_BIN="$2" exec "$1/scripts/demo" </dev/null' \
  "$work/sid" "$root" "$bin" >"$work/demo.log" 2>&1 || status=$?
sid=$(cat "$work/sid")
sleep 0.5
survivors=$(ps -e -o pid=,sid=,args= | awk -v s="$sid" '$2 == s')
if [ "$status" -ne 0 ]; then
  cat "$work/demo.log"
  echo "FAIL: the demo exited with status $status"
fi
if [ -n "$survivors" ]; then
  echo "FAIL: processes left behind by scripts/demo (session $sid):"
  echo "$survivors"
  echo "$survivors" | awk '{print $1}' | xargs -r kill -9 2>/dev/null || true
  exit 1
fi
[ "$status" -eq 0 ] || exit 1
# It really ran the fleet: three servers came up and the requests went through the router.
grep -q 'router: *http://127.0.0.1:' "$work/demo.log" || { cat "$work/demo.log"; echo "FAIL: the fleet did not start"; exit 1; }
grep -q 'Give me a verse. *-> http://' "$work/demo.log" || { cat "$work/demo.log"; echo "FAIL: no answer came through the router"; exit 1; }
echo "ok: the demo ran and left nothing behind"
