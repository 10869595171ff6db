#!/usr/bin/env bash
# Builds the Kafka-protocol test broker: librdkafka's mock cluster wrapped by
# the launcher test/services/mock-broker.c (see /work/shared/services.md,
# "Kafka: librdkafka's mock cluster as a broker process").
#
#   bash scripts/build-mock-broker.sh        # prints the binary path (last line)
#
# Idempotent: the binary is cached at ${MOCK_BROKER_DIR:-<repo>/.cache/mock-broker}
# together with a stamp holding the sha256 of (launcher source + this script).
# When both match, it exits at once. Otherwise it rebuilds (~70-90 s on 2
# cores) from the librdkafka sources bundled in the npm tarball of
# @confluentinc/kafka-javascript (the only network access is `npm pack`).
#
# Needs: gcc, make, zlib headers + libz.a (Debian: build-essential zlib1g-dev).
# Build output goes to $OUT_DIR/build.log; progress to stderr; stdout carries
# only the binary path. Concurrent invocations are serialised with flock.
set -euo pipefail

PKG='@confluentinc/kafka-javascript@1.10.1' # bundles librdkafka 2.15.x

SCRIPT_PATH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
REPO_ROOT="$(cd "$(dirname "$SCRIPT_PATH")/.." && pwd)"
LAUNCHER_SRC="$REPO_ROOT/test/services/mock-broker.c"
OUT_DIR="${MOCK_BROKER_DIR:-$REPO_ROOT/.cache/mock-broker}"
BIN="$OUT_DIR/mock-broker"
STAMP="$OUT_DIR/mock-broker.stamp"
LOG="$OUT_DIR/build.log"

log() { echo "[build-mock-broker] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ -f "$LAUNCHER_SRC" ]] || die "launcher source not found: $LAUNCHER_SRC"
mkdir -p "$OUT_DIR"

want_hash="$(cat "$LAUNCHER_SRC" "$SCRIPT_PATH" | sha256sum | cut -d' ' -f1)"
is_fresh() { [[ -x "$BIN" && -f "$STAMP" && "$(cat "$STAMP")" == "$want_hash" ]]; }

# Fast path, no lock needed.
if is_fresh; then
  echo "$BIN"
  exit 0
fi

# Serialise concurrent builders (e.g. several vitest workers starting at once);
# whoever waited re-checks the stamp after getting the lock.
exec 9>"$OUT_DIR/.lock"
flock -n 9 || { log "another build holds $OUT_DIR/.lock; waiting for it"; flock 9; }
if is_fresh; then
  echo "$BIN"
  exit 0
fi

for tool in gcc make npm tar sha256sum; do
  command -v "$tool" >/dev/null || die "'$tool' not found (Debian: apt-get install build-essential zlib1g-dev)"
done

WORK="$(mktemp -d "${TMPDIR:-/tmp}/mock-broker-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
: >"$LOG"
start=$SECONDS
# Any failing step: show the end of the build log on stderr.
trap 'rc=$?; if (( rc != 0 )); then log "failed (exit $rc); last lines of $LOG:"; tail -n 30 "$LOG" >&2 || true; fi; rm -rf "$WORK"' EXIT

log "fetching $PKG via npm pack"
(cd "$WORK" && npm pack "$PKG" --silent >>"$LOG" 2>&1)
tarball="$(ls "$WORK"/*.tgz)"
tar -xzf "$tarball" -C "$WORK" package/deps/librdkafka
RDK="$WORK/package/deps/librdkafka"
[[ -f "$RDK/src/rdkafka_mock.c" ]] || die "librdkafka sources missing in $tarball"
log "librdkafka $(sed -n 's/^# librdkafka v\([0-9.]*\).*/\1/p' "$RDK/CHANGELOG.md" | head -n1)"

# --- Patch 1: retention. rd_kafka_mock_partition_init() caps every partition at
# 5 MiB / 100k message sets and silently drops the oldest data beyond that.
# Raise both limits (4 GiB, 50M message sets) so tests/benchmarks see all data.
MOCK_C="$RDK/src/rdkafka_mock.c"
sed -i -E \
  -e 's|^([[:space:]]*mpart->max_size)[[:space:]]*=.*;.*$|\1 = (size_t)4 * 1024 * 1024 * 1024; /* PATCHED max_size */|' \
  -e 's|^([[:space:]]*mpart->max_cnt)[[:space:]]*=.*;.*$|\1 = 50000000; /* PATCHED max_cnt */|' \
  "$MOCK_C"
grep -Fq 'mpart->max_size = (size_t)4 * 1024 * 1024 * 1024; /* PATCHED max_size */' "$MOCK_C" \
  || die "retention patch (max_size) did not apply to rdkafka_mock.c"
grep -Fq 'mpart->max_cnt = 50000000; /* PATCHED max_cnt */' "$MOCK_C" \
  || die "retention patch (max_cnt) did not apply to rdkafka_mock.c"
if grep -Eq 'max_size[[:space:]]*=[[:space:]]*1024 \* 1024 \* 5|max_cnt[[:space:]]*=[[:space:]]*100000;' "$MOCK_C"; then
  die "old retention limits still present in rdkafka_mock.c"
fi

# --- Patch 2: optional fixed ports. The mock always binds port 0 (random) and
# the public API can only change the *advertised* port. Let the environment
# variable RD_KAFKA_MOCK_BASE_PORT pin broker N's listener to BASE_PORT+N-1
# (the launcher sets it for --port). Unset: unchanged behaviour.
anchor='listen_s = rd_kafka_mock_broker_new_listener(mcluster, &sin);'
[[ "$(grep -Fc "$anchor" "$MOCK_C")" == 1 ]] || die "port patch anchor not found exactly once in rdkafka_mock.c"
sed -i "/^[[:space:]]*listen_s = rd_kafka_mock_broker_new_listener(mcluster, &sin);/i\\
        { /* PATCHED base port */\\
                const char *base_port_ = getenv(\"RD_KAFKA_MOCK_BASE_PORT\");\\
                if (base_port_ \\&\\& atoi(base_port_) > 0)\\
                        sin.sin_port = htons(\\
                            (unsigned short)(atoi(base_port_) + broker_id - 1));\\
        }" "$MOCK_C"
grep -Fq '/* PATCHED base port */' "$MOCK_C" || die "port patch did not apply to rdkafka_mock.c"
grep -Fq 'if (base_port_ && atoi(base_port_) > 0)' "$MOCK_C" || die "port patch is malformed"

# --- Patch 3: a group's sync waits for every member's SyncGroup. The mock completes
# the sync as soon as every member has an assignment, which the leader's SyncGroup
# alone provides; a follower whose SyncGroup arrives after the leader's (a loaded
# machine) then finds the group Up, gets INVALID_REQUEST, and its kafkajs consumer
# crashes for good. Real brokers hand late followers their assignment instead.
CGRP_C="$RDK/src/rdkafka_mock_cgrp.c"
anchor3='rd_kafka_mock_cgrp_classic_sync_done(mcgrp, RD_KAFKA_RESP_ERR_NO_ERROR);'
[[ "$(grep -Fc "$anchor3" "$CGRP_C")" == 1 ]] || die "sync patch anchor not found exactly once in rdkafka_mock_cgrp.c"
sed -i "/^[[:space:]]*rd_kafka_mock_cgrp_classic_sync_done(mcgrp, RD_KAFKA_RESP_ERR_NO_ERROR);/i\\
        { /* PATCHED sync waits for every member */\\
                rd_kafka_mock_cgrp_classic_member_t *m_;\\
                int syncing_ = 0;\\
                TAILQ_FOREACH(m_, \\&mcgrp->members, link)\\
                        if (m_->resp)\\
                                syncing_++;\\
                if (syncing_ < mcgrp->member_cnt)\\
                        return;\\
        }" "$CGRP_C"
grep -Fq '/* PATCHED sync waits for every member */' "$CGRP_C" || die "sync patch did not apply to rdkafka_mock_cgrp.c"
grep -Fq 'TAILQ_FOREACH(m_, &mcgrp->members, link)' "$CGRP_C" || die "sync patch is malformed"

# --- Patch 4: member ids are never given twice. The mock names a member after its
# address in memory ("%p"), which a member joining later reuses once an earlier one
# is freed: a consumer the group dropped (its session timed out) could rejoin under
# the id it had, which real brokers never give again (they add a UUID). The intake
# tells a dropped membership by its new member id. Name members by a counter instead
# (the mock cluster handles requests on one thread).
anchor4='rd_snprintf(memberid, sizeof(memberid), "%p", member);'
[[ "$(grep -Fc "$anchor4" "$CGRP_C")" == 1 ]] || die "member id patch anchor not found exactly once in rdkafka_mock_cgrp.c"
sed -i 's|rd_snprintf(memberid, sizeof(memberid), "%p", member);|static unsigned long long next_member_id_; /* PATCHED unique member ids */ rd_snprintf(memberid, sizeof(memberid), "member-%llu", ++next_member_id_);|' "$CGRP_C"
grep -Fq '/* PATCHED unique member ids */' "$CGRP_C" || die "member id patch did not apply to rdkafka_mock_cgrp.c"

# --- Configure + build the static library (no TLS, SASL/GSSAPI, curl, zstd:
# the mock needs none of them and they would drag in more static deps).
log "configuring"
(cd "$RDK" && ./configure --disable-ssl --disable-gssapi --disable-curl \
  --disable-zstd --disable-lz4-ext --enable-static --no-download >>"$LOG" 2>&1)
jobs="${MAKE_JOBS:-$(nproc 2>/dev/null || echo 2)}"
log "building librdkafka.a (make -j$jobs, log: $LOG)"
make -C "$RDK/src" librdkafka.a -j"$jobs" >>"$LOG" 2>&1
[[ -f "$RDK/src/librdkafka.a" ]] || die "librdkafka.a was not produced"

# Link flags librdkafka's configure found (zlib, pthread, m, dl, rt...).
extra_libs="$(sed -n 's/^LIBS+=[[:space:]]*//p' "$RDK/Makefile.config" | tr '\n' ' ')"
log "linking launcher (extra libs: ${extra_libs:-none})"
# shellcheck disable=SC2086 # word splitting of the lib list is intended
gcc -O2 -Wall -Wextra -o "$WORK/mock-broker" "$LAUNCHER_SRC" \
  -isystem "$RDK/src" "$RDK/src/librdkafka.a" $extra_libs -lz -lpthread -lm -ldl -lrt >>"$LOG" 2>&1

# Smoke test: the binary must start, print BOOTSTRAP and stop on SIGTERM.
"$WORK/mock-broker" --topics smoke --partitions 1 >"$WORK/smoke.out" 2>>"$LOG" &
smoke_pid=$!
for _ in $(seq 1 50); do
  grep -q '^BOOTSTRAP ' "$WORK/smoke.out" && break
  sleep 0.1
done
kill -TERM "$smoke_pid" 2>/dev/null || true
wait "$smoke_pid" || die "smoke test: mock-broker exited non-zero"
grep -q '^BOOTSTRAP 127\.0\.0\.1:[0-9]' "$WORK/smoke.out" || die "smoke test: no BOOTSTRAP line"

# Install atomically, stamp last.
mv -f "$WORK/mock-broker" "$BIN.tmp.$$"
mv -f "$BIN.tmp.$$" "$BIN"
echo "$want_hash" >"$STAMP"
log "built in $((SECONDS - start)) s"
echo "$BIN"
