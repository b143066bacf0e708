#!/usr/bin/env bash
# Memory check for a pull request: build the program at this commit, record one run per config under
# alloctrace's recorder, tag the traces with the commit, upload them to the team's store, compare them with
# the base branch's traces and post the comparison. Exits 1 when a buffer grew past the threshold.
#
#   ci/memory-check.sh [build|record|upload|compare|comment|all]      (default: all)
#
# Settings (environment):
#   ALLOCTRACE_STORE      postgresql://... of the shared store (upload and compare go straight to it), or
#   ALLOCTRACE_SERVER     http(s)://... of a shared `alloctrace serve`, with ALLOCTRACE_TOKEN (a write token)
#   ALLOCTRACE_COMMIT     this commit (default: git rev-parse --short HEAD)
#   ALLOCTRACE_BASE       the base commit to compare with (default: the merge base with origin/$BASE_BRANCH)
#   BASE_BRANCH           default main;  ALLOCTRACE_BRANCH: this branch (default: git's)
#   ALLOCTRACE_BUILD      the build command (default: a shared-library CMake build into build/)
#   ALLOCTRACE_PROGRAM    the program to record (default: build/bin/llama-completion)
#   ALLOCTRACE_CONFIGS    one config a line, "NAME: FLAGS" (default: flash attention on and off)
#   ALLOCTRACE_RECORD     how one config is recorded into "$out" (default: alloctrace record -o "$out" -- ...)
#   ALLOCTRACE_THRESHOLD  growth allowed per buffer, e.g. 1% or 1MiB (default 0)
#   ALLOCTRACE_OUT        the work folder (default memory-check/); the comment is $ALLOCTRACE_OUT/memory.md
#   ALLOCTRACE_COMMENT    how memory.md is posted (default: gh pr comment "$PR" --body-file, when PR is set)
set -euo pipefail

OUT="${ALLOCTRACE_OUT:-memory-check}"
COMMIT="${ALLOCTRACE_COMMIT:-$(git rev-parse --short HEAD)}"
BRANCH="${ALLOCTRACE_BRANCH:-$(git rev-parse --abbrev-ref HEAD 2>/dev/null || echo unknown)}"
BASE="${ALLOCTRACE_BASE:-}"
THRESHOLD="${ALLOCTRACE_THRESHOLD:-0}"
PROGRAM="${ALLOCTRACE_PROGRAM:-build/bin/llama-completion}"
MODEL="${ALLOCTRACE_MODEL:-models/tiny-llama.gguf}"
CONFIGS="${ALLOCTRACE_CONFIGS:-fa-on: -fa on
fa-off: -fa off}"
RECORD="${ALLOCTRACE_RECORD:-alloctrace record -o \"\$out\" -- \"\$PROGRAM\" -m \"\$MODEL\" -p hello -n 1 -c 512 -ngl 0 -no-cnv -fit off -v \$flags}"
mkdir -p "$OUT"

base_commit() {
  if [ -z "$BASE" ]; then
    BASE="$(git merge-base HEAD "origin/${BASE_BRANCH:-main}" | cut -c1-"${#COMMIT}")"
  fi
  echo "$BASE"
}

build() {
  eval "${ALLOCTRACE_BUILD:-cmake -B build -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_TYPE=Release && cmake --build build -j}"
}

record() {
  rm -f "$OUT"/*.atrec
  while IFS= read -r line; do
    [ -n "${line// /}" ] || continue
    name="${line%%:*}"; flags="${line#*:}"; out="$OUT/$name.atrec"
    eval "$RECORD" >"$OUT/$name.log" 2>&1 || { echo "memory-check: recording $name failed:"; tail -20 "$OUT/$name.log"; return 2; }
  done <<< "$CONFIGS"
}

upload() {
  for f in "$OUT"/*.atrec; do
    name="$(basename "$f" .atrec)"
    if [ -n "${ALLOCTRACE_SERVER:-}" ]; then
      curl -fsS -H "Authorization: Bearer ${ALLOCTRACE_TOKEN:?a write token for $ALLOCTRACE_SERVER}" \
        -F "file=@$f" -F "name=$name $COMMIT" -F "tag=commit=$COMMIT" -F "tag=branch=$BRANCH" -F "tag=config=$name" \
        "$ALLOCTRACE_SERVER/api/traces" >/dev/null
    else
      alloctrace import "$f" --name "$name $COMMIT" --tag "commit=$COMMIT" --tag "branch=$BRANCH" --tag "config=$name" >/dev/null
    fi
  done
}

compare() {
  local base code status=0
  base="$(base_commit)"
  if [ -n "${ALLOCTRACE_SERVER:-}" ]; then
    code="$(curl -sS -o "$OUT/memory.md" -D "$OUT/headers" -w '%{http_code}' -G \
      -H "Authorization: Bearer ${ALLOCTRACE_TOKEN:-}" --data-urlencode "base=commit=$base" \
      --data-urlencode "head=commit=$COMMIT" --data-urlencode "threshold=$THRESHOLD" \
      --data-urlencode "format=markdown" "$ALLOCTRACE_SERVER/api/compare")"
    [ "$code" = 200 ] || { echo "memory-check: compare failed ($code): $(cat "$OUT/memory.md")"; return 2; }
    if grep -qi '^x-alloctrace-grew: true' "$OUT/headers"; then status=1; fi
  else
    alloctrace compare --base "commit=$base" --head "commit=$COMMIT" --threshold "$THRESHOLD" --markdown \
      >"$OUT/memory.md" || status=$?
  fi
  echo "$status" >"$OUT/status"
  cat "$OUT/memory.md"
  return 0
}

comment() {
  if [ -n "${ALLOCTRACE_COMMENT:-}" ]; then
    eval "$ALLOCTRACE_COMMENT"
  elif [ -n "${PR:-}" ] && command -v gh >/dev/null; then
    gh pr comment "$PR" --body-file "$OUT/memory.md"
  fi
  return "$(cat "$OUT/status")"
}

case "${1:-all}" in
  build|record|upload|compare|comment) "$1" ;;
  all) build && record && upload && compare && comment ;;
  *) echo "usage: $0 [build|record|upload|compare|comment|all]" >&2; exit 2 ;;
esac
