#!/usr/bin/env bash
# Back up Prefloop: a pg_dump of the whole database (custom format) plus the portable label
# export (export_all_labels, JSONL), both timestamped, with SHA-256 sums; keep the newest
# BACKUP_KEEP sets and delete older ones. See docs/DEPLOY.md "Backups".
#
#   scripts/backup.sh [BACKUP_DIR]          # default: $BACKUP_DIR or var/backups
#   docker compose run --rm backup          # the same inside the stack, into the backups volume
#
# Environment:
#   DATABASE_URL   required, postgres://user:password@host:port/dbname
#   BACKUP_KEEP    backup sets kept (default 14); 0 keeps everything
#   PG_DUMP        pg_dump command (default pg_dump; its major version >= the server's)
#   MANAGE         Django manage command (default "python manage.py"); SKIP_LABELS=1 skips
#                  the label export
#
# A set is written under *.partial names and renamed when complete, so a failed run leaves
# no file that looks like a good backup; old sets are only pruned after a good one.
set -euo pipefail
umask 077

BACKUP_DIR="${1:-${BACKUP_DIR:-var/backups}}"
BACKUP_KEEP="${BACKUP_KEEP:-14}"
PG_DUMP="${PG_DUMP:-pg_dump}"
MANAGE="${MANAGE:-python manage.py}"
SKIP_LABELS="${SKIP_LABELS:-0}"

if [ -z "${DATABASE_URL:-}" ]; then
  echo "backup.sh: DATABASE_URL is not set" >&2
  exit 2
fi
case "$BACKUP_KEEP" in
  ''|*[!0-9]*) echo "backup.sh: BACKUP_KEEP must be a whole number" >&2; exit 2 ;;
esac

mkdir -p "$BACKUP_DIR"
stamp="$(date -u +%Y%m%dT%H%M%SZ)"
base="$BACKUP_DIR/prefloop-$stamp"
dump="$base.dump"
labels="$base.labels.jsonl.gz"
cleanup() { rm -f "$dump.partial" "$labels.partial"; }
trap cleanup EXIT

echo "backup.sh: dumping the database to $dump"
# --no-owner/--no-privileges: restorable as another role on another server.
$PG_DUMP --format=custom --compress=6 --no-owner --no-privileges \
  --dbname="$DATABASE_URL" >"$dump.partial"
# A dump pg_restore cannot list is not a backup.
if command -v pg_restore >/dev/null 2>&1; then
  pg_restore --list "$dump.partial" >/dev/null
fi
mv "$dump.partial" "$dump"

files=("$(basename "$dump")")
if [ "$SKIP_LABELS" != "1" ]; then
  echo "backup.sh: exporting labels to $labels"
  # The command writes $labels.partial and renames it when the file is complete.
  $MANAGE export_all_labels --output "$labels"
  files+=("$(basename "$labels")")
fi
(cd "$BACKUP_DIR" && sha256sum "${files[@]}" >"prefloop-$stamp.sha256")

if [ "$BACKUP_KEEP" -gt 0 ]; then
  # Newest first by the timestamp in the name; everything past the first KEEP sets goes.
  find "$BACKUP_DIR" -maxdepth 1 -name 'prefloop-*.dump' -printf '%f\n' | sort -r |
    tail -n +"$((BACKUP_KEEP + 1))" | while read -r old; do
      old_base="$BACKUP_DIR/${old%.dump}"
      echo "backup.sh: pruning $old_base.*"
      rm -f "$old_base.dump" "$old_base.labels.jsonl.gz" "$old_base.sha256"
    done
fi
echo "backup.sh: done: $base.*"
