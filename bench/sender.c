/* Fast UDP sender for bench/live_capture.py: sendmmsg() batches, as many packets per second as
 * one core can push (or a fixed rate), for a fixed duration.
 *
 *   sender DST_IP DST_PORT SRC_PORT FLOWS PAYLOAD SECONDS BATCH RATE_PPS CPU
 *
 * FLOWS source ports SRC_PORT.. SRC_PORT+FLOWS-1 (one socket each, round robin per batch) so the
 * capture sees several flows. RATE_PPS 0 = flat out. CPU >= 0 pins the sender to that CPU.
 * Prints one JSON line: {"sent": N, "seconds": S, "errors": E}.
 * Compiled at run time by the benchmark (gcc -O2); never committed as a binary.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_BATCH 1024
#define MAX_FLOWS 256

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 10) {
        fprintf(stderr, "usage: %s DST_IP DST_PORT SRC_PORT FLOWS PAYLOAD SECONDS BATCH RATE_PPS CPU\n", argv[0]);
        return 2;
    }
    const char *dst_ip = argv[1];
    int dst_port = atoi(argv[2]), src_port = atoi(argv[3]), flows = atoi(argv[4]);
    int payload = atoi(argv[5]), batch = atoi(argv[7]), cpu = atoi(argv[9]);
    double seconds = atof(argv[6]), rate = atof(argv[8]);
    if (flows < 1 || flows > MAX_FLOWS || batch < 1 || batch > MAX_BATCH || payload < 1 || payload > 9000) {
        fprintf(stderr, "sender: bad FLOWS (1..%d), BATCH (1..%d) or PAYLOAD (1..9000)\n", MAX_FLOWS, MAX_BATCH);
        return 2;
    }
    if (cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        if (sched_setaffinity(0, sizeof(set), &set) != 0) perror("sched_setaffinity");
    }
    struct sockaddr_in dst;
    memset(&dst, 0, sizeof(dst));
    dst.sin_family = AF_INET;
    dst.sin_port = htons(dst_port);
    if (inet_pton(AF_INET, dst_ip, &dst.sin_addr) != 1) {
        fprintf(stderr, "sender: bad address %s\n", dst_ip);
        return 2;
    }
    int socks[MAX_FLOWS];
    for (int f = 0; f < flows; f++) {
        socks[f] = socket(AF_INET, SOCK_DGRAM, 0);
        if (socks[f] < 0) { perror("socket"); return 1; }
        int big = 8 << 20;
        setsockopt(socks[f], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
        struct sockaddr_in src;
        memset(&src, 0, sizeof(src));
        src.sin_family = AF_INET;
        src.sin_port = htons(src_port + f);
        src.sin_addr.s_addr = htonl(INADDR_ANY);
        if (bind(socks[f], (struct sockaddr *)&src, sizeof(src)) != 0) { perror("bind"); return 1; }
        if (connect(socks[f], (struct sockaddr *)&dst, sizeof(dst)) != 0) { perror("connect"); return 1; }
    }
    static char buf[MAX_BATCH][9000];
    static struct iovec iov[MAX_BATCH];
    static struct mmsghdr msgs[MAX_BATCH];
    for (int i = 0; i < batch; i++) {
        memset(buf[i], 'b', payload);
        iov[i].iov_base = buf[i];
        iov[i].iov_len = payload;
        memset(&msgs[i], 0, sizeof(msgs[i]));
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    unsigned long long sent = 0, errors = 0, seq = 0;
    double t0 = now(), end = t0 + seconds;
    int f = 0;
    for (;;) {
        double t = now();
        if (t >= end) break;
        if (rate > 0) {
            double due = t0 + (double)sent / rate;
            if (t < due) continue; /* busy wait: timers are too coarse for 300k pps */
        }
        for (int i = 0; i < batch; i++) { /* a sequence number in every payload */
            memcpy(buf[i], &seq, sizeof(seq));
            seq++;
        }
        int n = sendmmsg(socks[f], msgs, batch, 0);
        if (n < 0) {
            if (errno == ENOBUFS || errno == EAGAIN) { errors++; continue; }
            perror("sendmmsg");
            return 1;
        }
        sent += (unsigned long long)n;
        f = (f + 1) % flows;
    }
    double el = now() - t0;
    printf("{\"sent\": %llu, \"seconds\": %.6f, \"errors\": %llu}\n", sent, el, errors);
    return 0;
}
