#!/usr/bin/env bash
# A one-node SLURM cluster on this machine (Debian/Ubuntu, run as root), to test `snakemake --executor slurm`.
#
#   scripts/slurm_local_cluster.sh install   apt-get the SLURM, munge, slurmdbd and MariaDB packages
#   scripts/slurm_local_cluster.sh start     install if needed, write the configs, start every daemon, wait until idle
#   scripts/slurm_local_cluster.sh status    daemons, node state, accounting
#   scripts/slurm_local_cluster.sh stop      stop the daemons this script started (nothing else)
#
# Accounting is real (slurmdbd backed by a private MariaDB on 127.0.0.1): the Snakemake SLURM executor asks `sacct`
# for job states by default, and the test checks with `sacct` that every rule ran as a SLURM job.
# Configuration goes to /etc/slurm (where every SLURM command looks); state, logs and the database go to $STATE.
# Works without systemd (containers, firecracker VMs): every daemon is started directly and stopped by its pid file.
set -euo pipefail

STATE=${BLOCKLAB_SLURM_STATE:-/var/lib/blocklab-slurm}
ETC=/etc/slurm
MARKER="blocklab-local-cluster"
TEMPLATES="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/slurm"
HOST=$(hostname -s)
CTLD_PORT=${BLOCKLAB_SLURMCTLD_PORT:-6817}
SLURMD_PORT=${BLOCKLAB_SLURMD_PORT:-6818}
DBD_PORT=${BLOCKLAB_SLURMDBD_PORT:-6819}
DB_PORT=${BLOCKLAB_SLURM_DB_PORT:-3307}   # not 3306: leave any system MariaDB alone
ACCOUNT=${BLOCKLAB_SLURM_ACCOUNT:-blocklab}
PACKAGES=(slurm-wlm slurmctld slurmd slurm-client slurmdbd munge mariadb-server)

log() { echo "slurm_local_cluster: $*" >&2; }
die() { log "error: $*"; exit 1; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...: poll until COMMAND succeeds
    local seconds=$1 what=$2; shift 2
    for _ in $(seq "$seconds"); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 1
    done
    die "$what did not come up within ${seconds}s; see $STATE/log/"
}

pid_alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

cmd_install() {
    [[ $(id -u) == 0 ]] || die "run as root (apt-get and the daemons need it)"
    if dpkg -s "${PACKAGES[@]}" >/dev/null 2>&1; then
        log "packages already installed"
        return
    fi
    log "installing ${PACKAGES[*]}"
    apt-get update -q
    # No daemon may start from the package scripts: this script owns their configuration and lifetime.
    DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y -q --no-install-recommends "${PACKAGES[@]}"
}

check_ours() {  # never overwrite a configuration someone else wrote
    local file=$1
    if [[ -f $file ]] && ! grep -q "$MARKER" "$file"; then
        die "$file exists and was not written by this script; refusing to overwrite it"
    fi
}

render() {  # render TEMPLATE DEST MODE
    local node_line
    # slurmd -C reports this machine's sockets/cores/threads/memory; keep 10% of the memory for the OS.
    node_line=$(slurmd -C | head -1 | awk -v host="$HOST" '{
        for (i = 1; i <= NF; i++) {
            if ($i ~ /^NodeName=/) $i = "NodeName=" host " NodeAddr=127.0.0.1";
            if ($i ~ /^RealMemory=/) { split($i, kv, "="); $i = "RealMemory=" int(kv[2] * 0.9) }
        }
        print $0 " State=UNKNOWN" }')
    sed -e "s|@HOST@|$HOST|g" -e "s|@STATE@|$STATE|g" -e "s|@CTLD_PORT@|$CTLD_PORT|g" \
        -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" -e "s|@DBD_PORT@|$DBD_PORT|g" -e "s|@DB_PORT@|$DB_PORT|g" \
        -e "s|@DB_PASS@|$DB_PASS|g" -e "s|@NODE_LINE@|$node_line|g" "$1" > "$2"
    chmod "$3" "$2"
}

write_configs() {
    mkdir -p "$ETC" "$STATE"/{ctld,slurmd,log}
    chmod 700 "$STATE"
    check_ours "$ETC/slurm.conf"
    check_ours "$ETC/slurmdbd.conf"
    if [[ ! -f $STATE/db_password ]]; then
        (umask 077; head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' > "$STATE/db_password")
    fi
    DB_PASS=$(cat "$STATE/db_password")
    render "$TEMPLATES/slurm.conf.in" "$ETC/slurm.conf" 644
    render "$TEMPLATES/slurmdbd.conf.in" "$ETC/slurmdbd.conf" 600   # slurmdbd refuses a world-readable password
}

start_munge() {
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        log "munge already running (not started by this script)"
        return
    fi
    install -d -o munge -g munge -m 755 /run/munge
    # munged refuses to run as root; it runs as the munge user that owns the key.
    runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
    wait_for 20 munged sh -c 'munge -n | unmunge'
    cp /run/munge/munged.pid "$STATE/munged.pid"   # so that `stop` ends only a munged this script started
}

start_mariadb() {
    if pid_alive "$STATE/mariadb.pid"; then return; fi
    if [[ ! -d $STATE/mysql/mysql ]]; then
        mariadb-install-db --user=root --datadir="$STATE/mysql" --auth-root-authentication-method=socket \
            --skip-test-db >"$STATE/log/mariadb-install.log" 2>&1
    fi
    nohup mariadbd --user=root --datadir="$STATE/mysql" --socket="$STATE/mysql.sock" --port="$DB_PORT" \
        --bind-address=127.0.0.1 --pid-file="$STATE/mariadb.pid" --log-error="$STATE/log/mariadb.log" \
        --innodb-lock-wait-timeout=900 >/dev/null 2>&1 &
    wait_for 60 MariaDB mariadb-admin --socket="$STATE/mysql.sock" ping
    mariadb --socket="$STATE/mysql.sock" -u root <<SQL
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
SQL
}

start_slurm() {
    if ! pid_alive "$STATE/slurmdbd.pid"; then
        slurmdbd
        wait_for 60 slurmdbd sacctmgr -n list cluster
    fi
    # The cluster must exist in the database before slurmctld registers with it.
    if ! sacctmgr -n -P list cluster format=cluster | grep -qx blocklab; then
        sacctmgr -i add cluster blocklab >/dev/null
    fi
    # An account like a real cluster's, for the profile's slurm_account (jobs may also run without one).
    if ! sacctmgr -n -P list account format=account | grep -qx "$ACCOUNT"; then
        sacctmgr -i add account "$ACCOUNT" cluster=blocklab description="blocklab test jobs" >/dev/null
    fi
    if ! sacctmgr -n -P list assoc user="$(id -un)" account="$ACCOUNT" format=user | grep -q .; then
        sacctmgr -i add user "$(id -un)" account="$ACCOUNT" cluster=blocklab >/dev/null
    fi
    if ! pid_alive "$STATE/slurmctld.pid"; then
        slurmctld
        wait_for 60 slurmctld scontrol ping
    fi
    if ! pid_alive "$STATE/slurmd.pid"; then
        slurmd
    fi
    wait_for 60 "node $HOST" sh -c "sinfo -h -N -n '$HOST' -o %t | grep -Eq '^(idle|mix|alloc)'"
}

cmd_start() {
    command -v slurmctld >/dev/null && command -v slurmdbd >/dev/null && command -v mariadbd >/dev/null \
        || cmd_install
    write_configs
    start_munge
    start_mariadb
    start_slurm
    log "cluster 'blocklab' is up on $HOST: $(sinfo -h -o '%P %D nodes, %c CPUs, %m MB, %t')"
}

stop_pidfile() {  # stop_pidfile NAME: TERM the daemon of $STATE/NAME.pid and wait for it to exit
    local file=$STATE/$1.pid pid
    pid_alive "$file" || { rm -f "$file"; return 0; }
    pid=$(cat "$file")
    kill "$pid"
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$pid" 2>/dev/null && die "$1 (pid $pid) did not stop"
    rm -f "$file"
    log "stopped $1"
}

cmd_stop() {
    # Reverse order of start; munge only if this script started it.
    for name in slurmd slurmctld slurmdbd mariadb munged; do stop_pidfile "$name"; done
}

cmd_status() {
    for name in munged mariadb slurmdbd slurmctld slurmd; do
        if pid_alive "$STATE/$name.pid"; then echo "$name: running (pid $(cat "$STATE/$name.pid"))"
        else echo "$name: not running (or not started by this script)"; fi
    done
    sinfo 2>/dev/null || true
    sacctmgr -n list cluster format=cluster,controlhost 2>/dev/null || true
}

case "${1:-}" in
    install) cmd_install ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    *) echo "usage: $0 install|start|stop|status" >&2; exit 2 ;;
esac
