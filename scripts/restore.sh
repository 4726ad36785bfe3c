#!/usr/bin/env bash
# Restore Prefloop from a backup set written by scripts/backup.sh. See docs/DEPLOY.md.
#
#   scripts/restore.sh --yes BACKUP.dump
#       Replace the whole database with the dump (pg_restore --clean, one transaction),
#       then apply any newer migrations. Stop web, workers and beat first.
#   scripts/restore.sh --labels BACKUP.labels.jsonl.gz [--force]
#       Load the label export into an EMPTY instance (import_all_labels; atomic).
#
# Environment: DATABASE_URL (required), PG_RESTORE (default pg_restore),
#              MANAGE (default "python manage.py").
# A file with a matching .sha256 beside it is checked before anything is touched.
set -euo pipefail

PG_RESTORE="${PG_RESTORE:-pg_restore}"
MANAGE="${MANAGE:-python manage.py}"

usage() {
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

mode=dump yes=0 force=() file=""
while [ $# -gt 0 ]; do
  case "$1" in
    --yes) yes=1 ;;
    --labels) mode=labels ;;
    --force) force=(--force) ;;
    -h|--help) usage ;;
    -*) echo "restore.sh: unknown option $1" >&2; usage ;;
    *) [ -z "$file" ] || usage; file="$1" ;;
  esac
  shift
done
[ -n "$file" ] || usage
[ -f "$file" ] || { echo "restore.sh: no such file: $file" >&2; exit 2; }
if [ -z "${DATABASE_URL:-}" ]; then
  echo "restore.sh: DATABASE_URL is not set" >&2
  exit 2
fi

# Verify against the set's checksum file when there is one.
dir="$(dirname "$file")"
name="$(basename "$file")"
stamp="${name#prefloop-}"
stamp="${stamp%%.*}"
sums="$dir/prefloop-$stamp.sha256"
if [ -f "$sums" ]; then
  (cd "$dir" && grep -F "  $name" "prefloop-$stamp.sha256" | sha256sum --check --quiet -) || {
    echo "restore.sh: checksum mismatch for $file" >&2
    exit 1
  }
  echo "restore.sh: checksum ok"
fi

if [ "$mode" = labels ]; then
  echo "restore.sh: importing labels from $file"
  $MANAGE import_all_labels "$file" "${force[@]}"
  exit 0
fi

"$PG_RESTORE" --list "$file" >/dev/null
if [ "$yes" != 1 ]; then
  echo "restore.sh: this replaces every table of the database in DATABASE_URL with $file." >&2
  echo "restore.sh: stop web, workers and beat, then run again with --yes." >&2
  exit 2
fi
echo "restore.sh: restoring $file"
"$PG_RESTORE" --clean --if-exists --no-owner --no-privileges --single-transaction \
  --exit-on-error --dbname="$DATABASE_URL" "$file"
echo "restore.sh: applying migrations newer than the dump"
$MANAGE migrate --noinput
echo "restore.sh: done"
