#!/usr/bin/env bash
# Memory check for a pull request: build the program at this commit, record one run per config under
# alloctrace's recorder, tag the traces with the commit, store them, compare them with the base branch's
# nearest recorded commit and post the comparison on the pull request (one comment, edited on every push).
# Exits 1 when a buffer grew past the threshold, 3 when traces paired with nothing, 2 when a step failed.
#
#   memory-check.sh [build|record|upload|compare|comment|all]      (default: all)
#
# It ships inside the package: bash "$(python -m alloctrace.ci)" all
# `all` runs build, record, upload, then compare and comment when PR is set (a pull request).
#
# Settings (environment); an unset or empty one takes its default:
#   ALLOCTRACE_STORE      where traces go: a PostgreSQL URL or a directory (default: $ALLOCTRACE_OUT/store, a
#                         store of this job only; the merge base is then built and recorded in the same job)
#   ALLOCTRACE_SERVER     http(s)://... of a shared `alloctrace serve` instead, with ALLOCTRACE_TOKEN (write token)
#   ALLOCTRACE_RECORD_BASE  yes|no|auto: also build and record the merge base here (auto: yes without a shared
#                         store or server)
#   ALLOCTRACE_COMMIT     this commit (default: git rev-parse --short=12 HEAD)
#   ALLOCTRACE_BASE       compare with this commit (default: the merge base with origin/$BASE_BRANCH, else its
#                         nearest recorded first-parent ancestor, else the newest trace of branch=$BASE_BRANCH)
#   BASE_BRANCH           default main;  ALLOCTRACE_BRANCH: this branch (default: git's)
#   ALLOCTRACE_BUILD      the build command (default: a shared-library CMake build into build/)
#   ALLOCTRACE_PROGRAM    the program to record (default: build/bin/llama-completion)
#   ALLOCTRACE_MODEL      its model (default: models/stories260K.gguf), fetched from ALLOCTRACE_MODEL_URL when
#                         missing (default: ggml-org's 260K-parameter tinyllamas test model on Hugging Face)
#   ALLOCTRACE_CONFIGS    one config a line, "NAME: FLAGS" (default: flash attention on and off)
#   ALLOCTRACE_RECORD     how one config is recorded into "$out" (default: alloctrace record -o "$out" -- ...)
#   ALLOCTRACE_THRESHOLD  growth allowed per buffer, e.g. 1% or 1MiB (default 0)
#   ALLOCTRACE_OUT        the work folder (default memory-check/); the comment is $ALLOCTRACE_OUT/memory.md
#   ALLOCTRACE_DASHBOARD  the dashboard's address, for the comment's link (default: $ALLOCTRACE_SERVER; none: no link)
#   ALLOCTRACE_MARKER     the hidden marker that finds this job's earlier comment (default: alloctrace-memory-check)
#   ALLOCTRACE_COMMENT    a command that posts $OUT/memory.md instead of the GitHub API
#   PR, GITHUB_REPOSITORY, GITHUB_TOKEN (or GH_TOKEN), GITHUB_API_URL: the pull request the comment goes on
set -euo pipefail

OUT="${ALLOCTRACE_OUT:-memory-check}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
COMMIT="${ALLOCTRACE_COMMIT:-$(git rev-parse --short=12 HEAD)}"
BRANCH="${ALLOCTRACE_BRANCH:-$(git rev-parse --abbrev-ref HEAD 2>/dev/null || echo unknown)}"
BASE_BRANCH="${BASE_BRANCH:-main}"
THRESHOLD="${ALLOCTRACE_THRESHOLD:-0}"
PROGRAM="${ALLOCTRACE_PROGRAM:-build/bin/llama-completion}"
MODEL="${ALLOCTRACE_MODEL:-models/stories260K.gguf}"
MODEL_URL="${ALLOCTRACE_MODEL_URL:-https://huggingface.co/ggml-org/models/resolve/main/tinyllamas/stories260K.gguf}"
CONFIGS="${ALLOCTRACE_CONFIGS:-fa-on: -fa on
fa-off: -fa off}"
RECORD="${ALLOCTRACE_RECORD:-alloctrace record -o \"\$out\" -- \"\$PROGRAM\" -m \"\$MODEL\" -p hello -n 1 -c 256 -ngl 0 -no-cnv -fit off -v \$flags}"
BUILD="${ALLOCTRACE_BUILD:-cmake -B build -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_TYPE=Release && cmake --build build -j}"
MARKER="${ALLOCTRACE_MARKER:-alloctrace-memory-check}"
DASHBOARD="${ALLOCTRACE_DASHBOARD:-${ALLOCTRACE_SERVER:-}}"
WALK=200
if [ -z "${ALLOCTRACE_STORE:-}" ] && [ -z "${ALLOCTRACE_SERVER:-}" ]; then
  export ALLOCTRACE_STORE="$OUT/store"
  SHARED=no
else
  SHARED=yes
fi
RECORD_BASE="${ALLOCTRACE_RECORD_BASE:-auto}"
[ "$RECORD_BASE" != auto ] || { [ "$SHARED" = no ] && RECORD_BASE=yes || RECORD_BASE=no; }

fail() { echo "memory-check: $*" >&2; return 2; }

merge_base() { git merge-base HEAD "origin/$BASE_BRANCH" 2>/dev/null || git merge-base HEAD "$BASE_BRANCH"; }

build() {
  eval "$BUILD" || fail "the build failed: $BUILD"
}

record_into() {  # $1: folder for the .atrec files; runs in the source tree of the commit being recorded
  local dir="$1" line name flags out
  mkdir -p "$dir"
  rm -f "$dir"/*.atrec
  if [ ! -e "$MODEL" ] && [ -n "$MODEL_URL" ]; then
    mkdir -p "$(dirname "$MODEL")"
    curl -fsSL --retry 3 -o "$MODEL" "$MODEL_URL" || { rm -f "$MODEL"; fail "cannot fetch the model from $MODEL_URL"; return 2; }
  fi
  while IFS= read -r line; do
    [ -n "${line// /}" ] || continue
    name="${line%%:*}"; flags="${line#*:}"; out="$dir/$name.atrec"
    eval "$RECORD" >"$dir/$name.log" 2>&1 || { tail -20 "$dir/$name.log" >&2; fail "recording $name failed"; return 2; }
  done <<< "$CONFIGS"
}

record() {
  record_into "$OUT/head" || return 2
  echo "$COMMIT" >"$OUT/head/commit"
  rm -rf "$OUT/base"
  local mb
  if [ "$RECORD_BASE" = yes ] && mb="$(merge_base)" && [ "$mb" != "$(git rev-parse HEAD)" ]; then
    git worktree remove --force "$OUT/base-src" 2>/dev/null || true
    git worktree add --detach "$OUT/base-src" "$mb" >/dev/null || fail "cannot check out the merge base $mb"
    (cd "$OUT/base-src" && build && record_into "$OUT/base") || return 2
    git rev-parse --short=12 "$mb" >"$OUT/base/commit"
    echo "$BASE_BRANCH" >"$OUT/base/branch"
  fi
}

upload_dir() {  # $1: a folder record_into filled, with its commit (and branch) beside
  local dir="$1" commit branch f name
  commit="$(cat "$dir/commit")"; branch="$(cat "$dir/branch" 2>/dev/null || echo "$BRANCH")"
  for f in "$dir"/*.atrec; do
    [ -e "$f" ] || fail "nothing recorded in $dir" || return 2
    name="$(basename "$f" .atrec)"
    if [ -n "${ALLOCTRACE_SERVER:-}" ]; then
      curl -fsS -H "Authorization: Bearer ${ALLOCTRACE_TOKEN:-}" \
        -F "file=@$f" -F "name=$name $commit" -F "tag=commit=$commit" -F "tag=branch=$branch" -F "tag=config=$name" \
        "$ALLOCTRACE_SERVER/api/traces" >/dev/null || fail "uploading $f to $ALLOCTRACE_SERVER failed" || return 2
    else
      alloctrace import "$f" --name "$name $commit" --tag "commit=$commit" --tag "branch=$branch" \
        --tag "config=$name" >/dev/null || fail "storing $f failed" || return 2
    fi
  done
}

upload() {
  upload_dir "$OUT/head" || return 2
  if [ -e "$OUT/base/commit" ]; then upload_dir "$OUT/base" || return 2; fi
}

compare() {
  local status base mb body="$OUT/compare.md"
  if [ -n "${ALLOCTRACE_SERVER:-}" ]; then
    local args=(--data-urlencode "head=commit=$COMMIT" --data-urlencode "threshold=$THRESHOLD"
                --data-urlencode "format=markdown" --data-urlencode "base_branch=$BASE_BRANCH")
    if [ -n "${ALLOCTRACE_BASE:-}" ]; then
      args+=(--data-urlencode "base=commit=$ALLOCTRACE_BASE")
    else
      mb="$(merge_base)" || fail "no merge base of HEAD and $BASE_BRANCH (fetch-depth: 0?)" || return 2
      for c in $(git rev-list --first-parent --max-count="$WALK" "$mb"); do args+=(--data-urlencode "ancestor=$c"); done
    fi
    local code
    code="$(curl -sS -o "$body" -D "$OUT/headers" -w '%{http_code}' -G \
      -H "Authorization: Bearer ${ALLOCTRACE_TOKEN:-}" "${args[@]}" "$ALLOCTRACE_SERVER/api/compare")" || code=000
    [ "$code" = 200 ] || fail "compare failed ($code): $(cat "$body" 2>/dev/null)" || return 2
    status="$(sed -n 's/^[Xx]-[Aa]lloctrace-[Ss]tatus: *\([0-9]*\).*/\1/p' "$OUT/headers")"
  else
    local side=(--base-ref "origin/$BASE_BRANCH" --base-branch "$BASE_BRANCH")
    git rev-parse -q --verify "origin/$BASE_BRANCH" >/dev/null || side=(--base-ref "$BASE_BRANCH")
    [ -z "${ALLOCTRACE_BASE:-}" ] || side=(--base "commit=$ALLOCTRACE_BASE")
    status=0
    alloctrace compare "${side[@]}" --head "commit=$COMMIT" --threshold "$THRESHOLD" --markdown >"$body" || status=$?
    [ "$status" != 2 ] || fail "compare failed" || return 2
  fi
  base="$(sed -n '1s/^### Memory: commit=\([0-9A-Za-z]*\) .*/\1/p' "$body")"
  {
    echo "<!-- $MARKER -->"
    cat "$body"
    if [ -n "$DASHBOARD" ] && [ -n "$base" ]; then
      echo
      echo "[Open this comparison on the dashboard](${DASHBOARD%/}/history?key=commit&base=$base&head=$COMMIT#compare)"
    fi
  } >"$OUT/memory.md"
  echo "${status:-2}" >"$OUT/status"
  cat "$OUT/memory.md"
}

github() {  # METHOD PATH [BODY-FILE]: the GitHub REST API, the answer on stdout
  local token="${GITHUB_TOKEN:-${GH_TOKEN:-}}"
  curl -fsS -X "$1" -H "Authorization: Bearer $token" -H "Accept: application/vnd.github+json" \
    ${3:+--data-binary "@$3"} "${GITHUB_API_URL:-https://api.github.com}$2"
}

comment() {
  [ -e "$OUT/status" ] || fail "no comparison to post: run compare first" || return 2
  if [ -n "${ALLOCTRACE_COMMENT:-}" ]; then
    eval "$ALLOCTRACE_COMMENT" || fail "posting the comment failed: $ALLOCTRACE_COMMENT" || return 2
  elif [ -n "${PR:-}" ] && [ -n "${GITHUB_REPOSITORY:-}" ]; then
    local page id="" found
    for page in $(seq 1 30); do  # 100 comments a page; the earlier comment of this job carries the marker
      found="$(github GET "/repos/$GITHUB_REPOSITORY/issues/$PR/comments?per_page=100&page=$page" | python3 -c '
import json, sys
rows = json.load(sys.stdin)
hit = [str(r["id"]) for r in rows if "<!-- " + sys.argv[1] + " -->" in (r.get("body") or "")]
print(hit[0] if hit else ("more" if len(rows) == 100 else ""))' "$MARKER")" || fail "cannot list the comments of PR $PR" || return 2
      [ "$found" = more ] || { id="$found"; break; }
    done
    python3 -c 'import json, sys; print(json.dumps({"body": open(sys.argv[1], encoding="utf-8").read()}))' \
      "$OUT/memory.md" >"$OUT/comment.json"
    if [ -n "$id" ]; then
      github PATCH "/repos/$GITHUB_REPOSITORY/issues/comments/$id" "$OUT/comment.json" >/dev/null \
        || fail "cannot edit comment $id" || return 2
    else
      github POST "/repos/$GITHUB_REPOSITORY/issues/$PR/comments" "$OUT/comment.json" >/dev/null \
        || fail "cannot comment on PR $PR" || return 2
    fi
  else
    echo "memory-check: no pull request to comment on (PR, GITHUB_REPOSITORY); see $OUT/memory.md"
  fi
  return "$(cat "$OUT/status")"
}

all() {
  build || return $?
  record || return $?
  upload || return $?
  if [ -n "${PR:-}" ]; then
    compare || return $?
    comment
  fi
}

case "${1:-all}" in
  build|record|upload|compare|comment|all) "${1:-all}" ;;
  *) echo "usage: $0 [build|record|upload|compare|comment|all]" >&2; exit 2 ;;
esac
