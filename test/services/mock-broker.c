/*
 * mock-broker: librdkafka's mock Kafka cluster (rdkafka_mock.h, librdkafka
 * 2.15) as a standalone broker process for tests and benchmarks. It speaks the
 * real Kafka wire protocol on 127.0.0.1; built by scripts/build-mock-broker.sh.
 *
 *   mock-broker [--topics a,b,c] [--partitions N=4] [--brokers N=1]
 *               [--port P] [--exit-on-stdin-eof]
 *
 * Prints exactly one line "BOOTSTRAP host:port[,host:port...]" on stdout once
 * the cluster is ready, then serves until SIGTERM/SIGINT/SIGHUP, until the
 * parent process dies (Linux PR_SET_PDEATHSIG) or, with --exit-on-stdin-eof,
 * until stdin is closed. All data lives in memory and is lost on exit.
 * --port pins broker 1 to P (broker N to P+N-1); this relies on the
 * RD_KAFKA_MOCK_BASE_PORT patch applied by the build script. Without --port
 * the ports are random. Diagnostics go to stderr.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "rdkafka.h"
#include "rdkafka_mock.h"

#define API_KEY_LEAVE_GROUP 13

static void die(const char *msg) {
        fprintf(stderr, "mock-broker: %s\n", msg);
        exit(1);
}

/* Returns 1 if 127.0.0.1:port can be bound. Checked up front because a bind
 * failure inside rd_kafka_mock_cluster_new() ends in an assert (abort) in
 * 2.15's cleanup path instead of a clean error. */
static int port_free(int port) {
        struct sockaddr_in sin = {.sin_family = AF_INET,
                                  .sin_port = htons((unsigned short)port),
                                  .sin_addr = {.s_addr = htonl(INADDR_LOOPBACK)}};
        int on = 1, ok, s = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)); /* as the mock does */
        ok = s >= 0 && bind(s, (struct sockaddr *)&sin, sizeof(sin)) == 0;
        if (s >= 0) close(s);
        return ok;
}

/* Reads stdin until EOF, then asks the main thread (sigwait) to shut down. */
static void *stdin_watcher(void *arg) {
        char buf[256];
        (void)arg;
        while (read(STDIN_FILENO, buf, sizeof(buf)) > 0)
                ;
        kill(getpid(), SIGTERM);
        return NULL;
}

int main(int argc, char **argv) {
        const char *topics = "", *debug = NULL;
        int partitions = 4, brokers = 1, port = 0, stdin_eof = 0, i, sig;
        char errstr[512], *list, *topic, *save = NULL;
        pid_t parent = getppid();
        sigset_t sigs;
        pthread_t watcher;

        for (i = 1; i < argc; i++) {
                const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
                if (!strcmp(a, "--exit-on-stdin-eof")) { stdin_eof = 1; continue; }
                if (!v) die("usage: mock-broker [--topics a,b] [--partitions N] "
                            "[--brokers N] [--port P] [--debug mock] [--exit-on-stdin-eof]");
                if (!strcmp(a, "--topics")) topics = v;
                else if (!strcmp(a, "--partitions")) partitions = atoi(v);
                else if (!strcmp(a, "--brokers")) brokers = atoi(v);
                else if (!strcmp(a, "--port")) port = atoi(v);
                else if (!strcmp(a, "--debug")) debug = v; /* librdkafka debug contexts, to stderr */
                else die("unknown argument (see usage in mock-broker.c)");
                i++;
        }
        if (partitions < 1 || brokers < 1 || port < 0 || port > 65535)
                die("--partitions/--brokers must be >= 1, --port in 0..65535");

#ifdef __linux__
        /* Die with the parent (test runner) so no orphan brokers linger. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) return 0; /* parent already gone */
#else
        (void)parent;
#endif

        /* Block the shutdown signals before librdkafka starts its threads, so
         * they inherit the mask and only sigwait() below receives them. */
        sigemptyset(&sigs);
        sigaddset(&sigs, SIGTERM);
        sigaddset(&sigs, SIGINT);
        sigaddset(&sigs, SIGHUP);
        pthread_sigmask(SIG_BLOCK, &sigs, NULL);

        if (port) { /* read by the patched rd_kafka_mock_broker_new() */
                char p[16];
                for (i = 0; i < brokers; i++)
                        if (!port_free(port + i)) {
                                fprintf(stderr, "mock-broker: port %d is in use\n", port + i);
                                return 1;
                        }
                snprintf(p, sizeof(p), "%d", port);
                setenv("RD_KAFKA_MOCK_BASE_PORT", p, 1);
        }

        /* The mock cluster needs an rd_kafka_t for its bookkeeping/threads;
         * this producer never connects anywhere itself. */
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        rd_kafka_conf_set(conf, "log_level", debug ? "7" : "4", NULL, 0); /* warnings+ */
        if (debug && rd_kafka_conf_set(conf, "debug", debug, errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
                die(errstr);
        rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
        if (!rk) die(errstr);

        rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(rk, brokers);
        if (!mc) die("rd_kafka_mock_cluster_new failed (port in use?)");

        /* Quirks for kafkajs 2.2.4 (see /work/shared/services.md):
         * - LeaveGroup v3+ carries a members[] array, but the mock's handler
         *   always parses the v0-2 layout (one MemberId), so kafkajs members
         *   would never leave; advertise only v0..2 so kafkajs uses v2.
         * - 2.15 reports no controller unless told; kafkajs wants one.
         * - The first join of an empty group would wait 3 s by default. */
        rd_kafka_mock_set_apiversion(mc, API_KEY_LEAVE_GROUP, 0, 2);
        rd_kafka_mock_set_controller_id(mc, 1);
        rd_kafka_mock_group_initial_rebalance_delay_ms(mc, 0);

        /* Pre-create topics (others are auto-created with 4 partitions). */
        list = strdup(topics);
        for (topic = strtok_r(list, ",", &save); topic; topic = strtok_r(NULL, ",", &save)) {
                rd_kafka_resp_err_t err = rd_kafka_mock_topic_create(
                    mc, topic, partitions, brokers < 3 ? brokers : 3);
                if (err) {
                        fprintf(stderr, "mock-broker: topic %s: %s\n", topic, rd_kafka_err2str(err));
                        return 1;
                }
        }
        free(list);

        const char *bootstraps = rd_kafka_mock_cluster_bootstraps(mc);
        if (port) { /* fail loudly if the port patch was not compiled in */
                char want[16];
                snprintf(want, sizeof(want), ":%d", port);
                if (!strstr(bootstraps, want)) die("--port ignored: librdkafka lacks the base-port patch");
        }
        printf("BOOTSTRAP %s\n", bootstraps);
        fflush(stdout);

        if (stdin_eof && pthread_create(&watcher, NULL, stdin_watcher, NULL) == 0)
                pthread_detach(watcher);

        sigwait(&sigs, &sig);
        fprintf(stderr, "mock-broker: signal %d, shutting down\n", sig);
        rd_kafka_mock_cluster_destroy(mc);
        rd_kafka_destroy(rk);
        return 0;
}
