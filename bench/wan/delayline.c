/* FStream WAN delay line: joins two TUN devices (one per network namespace) and holds
 * every packet for a fixed one-way delay in each direction, preserving packet order.
 *
 * Single thread: epoll over both TUN fds, one timerfd (armed for the earliest due packet)
 * and a UNIX datagram control socket.  Each direction has a byte ring of variable-length
 * records {due time, length, packet}; packets are read straight into the ring and written
 * to the other TUN when due.  With --vnet the TUNs carry a virtio-net header and accept
 * TSO/checksum offload, so the kernel hands over 64 KiB GSO packets (far fewer syscalls).
 *
 * Control socket commands (one datagram each, reply sent back to the sender):
 *   "blackhole SECONDS"  drop every packet, both directions, for SECONDS (0 ends it)
 *   "delay MICROSECONDS" change the one-way delay (FIFO order is kept)
 *   "stats"              one line of key=value counters
 *   "ping"               "pong"
 *
 * --rt-prio N runs the loop under SCHED_FIFO so a loaded machine does not add jitter.
 *
 * Build: cc -O2 -o delayline delayline.c   (Linux only)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAXPKT (65536 + 64) /* largest GSO packet + virtio-net header, rounded up */
#define HDR 16u             /* record header size; records are 16-byte aligned */
#define WRAP 1u
#define READ_BUDGET 256     /* packets read per fd per wake-up before flushing */

struct rec {
    uint64_t due;
    uint32_t len;
    uint32_t flags;
};

struct ring {
    uint8_t *buf;
    size_t size, head, tail, count, bytes, max_bytes;
};

struct side {
    const char *ns, *dev;
    int fd;
    struct ring out; /* packets read from this side, waiting to be written to the other */
    uint64_t rx_pkts, rx_bytes, tx_pkts, tx_bytes;
    uint64_t drop_full, drop_blackhole, drop_write;
};

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what, const char *arg) {
    fprintf(stderr, "delayline: %s %s: %s\n", what, arg ? arg : "", strerror(errno));
    exit(1);
}

static size_t align16(size_t n) { return (n + 15u) & ~(size_t)15u; }

/* Contiguous room for one record of up to MAXPKT bytes, or NULL when the ring is full. */
static uint8_t *ring_reserve(struct ring *r) {
    size_t need = HDR + MAXPKT;
    if (r->count == 0) r->head = r->tail = 0;
    if (r->tail >= r->head) {
        if (r->size - r->tail >= need) return r->buf + r->tail;
        if (r->head > need) { /* wrap to the start */
            if (r->size - r->tail >= HDR) {
                struct rec *w = (struct rec *)(r->buf + r->tail);
                w->flags = WRAP;
                w->len = 0;
            }
            r->tail = 0;
            return r->buf;
        }
        return NULL;
    }
    if (r->head - r->tail > need) return r->buf + r->tail;
    return NULL;
}

static void ring_commit(struct ring *r, uint64_t due, uint32_t len) {
    struct rec *h = (struct rec *)(r->buf + r->tail);
    h->due = due;
    h->len = len;
    h->flags = 0;
    r->tail += HDR + align16(len);
    r->count++;
    r->bytes += len;
    if (r->bytes > r->max_bytes) r->max_bytes = r->bytes;
}

static struct rec *ring_peek(struct ring *r) {
    if (r->count == 0) return NULL;
    if (r->size - r->head < HDR) r->head = 0;
    struct rec *h = (struct rec *)(r->buf + r->head);
    if (h->flags & WRAP) {
        r->head = 0;
        h = (struct rec *)r->buf;
    }
    return h;
}

static void ring_pop(struct ring *r) {
    struct rec *h = (struct rec *)(r->buf + r->head);
    r->head += HDR + align16(h->len);
    r->count--;
    r->bytes -= h->len;
    if (r->count == 0) r->head = r->tail = 0;
}

static int open_tun_in_ns(const char *ns_path, const char *dev, int vnet, int home_ns) {
    int nsfd = open(ns_path, O_RDONLY | O_CLOEXEC);
    if (nsfd < 0) die("open netns", ns_path);
    if (setns(nsfd, CLONE_NEWNET) < 0) die("setns", ns_path);
    close(nsfd);
    int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) die("open", "/dev/net/tun");
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI | (vnet ? IFF_VNET_HDR : 0);
    strncpy(ifr.ifr_name, dev, IFNAMSIZ - 1);
    if (ioctl(fd, TUNSETIFF, &ifr) < 0) die("TUNSETIFF", dev);
    if (vnet) {
        unsigned off = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6;
        if (ioctl(fd, TUNSETOFFLOAD, off) < 0) die("TUNSETOFFLOAD", dev);
    }
    if (setns(home_ns, CLONE_NEWNET) < 0) die("setns back", "");
    return fd;
}

static int read_side(struct side *s, uint64_t now, uint64_t delay, uint64_t blackhole_until) {
    static uint8_t scratch[MAXPKT];
    for (int i = 0; i < READ_BUDGET; i++) {
        uint8_t *slot = ring_reserve(&s->out);
        uint8_t *dst = slot ? slot + HDR : scratch;
        ssize_t n = read(s->fd, dst, MAXPKT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) return 0;
            if (errno == EBADFD || errno == EIO) return -1; /* device gone */
            return 0;
        }
        s->rx_pkts++;
        s->rx_bytes += (uint64_t)n;
        if (now < blackhole_until) {
            s->drop_blackhole++;
        } else if (!slot) {
            s->drop_full++;
        } else {
            ring_commit(&s->out, now + delay, (uint32_t)n);
        }
    }
    return 0;
}

/* Write every due packet of s->out to the other side; return the next due time (0: none). */
static uint64_t flush_side(struct side *s, struct side *to, uint64_t now, uint64_t blackhole_until) {
    struct rec *h;
    while ((h = ring_peek(&s->out)) != NULL) {
        if (h->due > now) return h->due;
        if (now < blackhole_until) {
            to->drop_blackhole++;
        } else {
            ssize_t n = write(to->fd, (uint8_t *)h + HDR, h->len);
            if (n < 0) {
                if (errno == EAGAIN || errno == EINTR) {
                    to->drop_write++;
                } else {
                    to->drop_write++;
                }
            } else {
                to->tx_pkts++;
                to->tx_bytes += h->len;
            }
        }
        ring_pop(&s->out);
    }
    return 0;
}

static void usage(void) {
    fprintf(stderr,
            "usage: delayline --ns-a PATH --dev-a NAME --ns-b PATH --dev-b NAME --delay-us N\n"
            "                 [--ctl SOCKET_PATH] [--ring-bytes N] [--vnet] [--rt-prio N]\n");
    exit(2);
}

int main(int argc, char **argv) {
    struct side a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    const char *ctl_path = NULL;
    uint64_t delay = 0;
    size_t ring_bytes = 64u << 20;
    int vnet = 0, rt_prio = 0;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "--vnet")) { vnet = 1; continue; }
        if (!v) usage();
        i++;
        if (!strcmp(k, "--ns-a")) a.ns = v;
        else if (!strcmp(k, "--dev-a")) a.dev = v;
        else if (!strcmp(k, "--ns-b")) b.ns = v;
        else if (!strcmp(k, "--dev-b")) b.dev = v;
        else if (!strcmp(k, "--delay-us")) delay = strtoull(v, NULL, 10) * 1000ull;
        else if (!strcmp(k, "--ctl")) ctl_path = v;
        else if (!strcmp(k, "--ring-bytes")) ring_bytes = (size_t)strtoull(v, NULL, 10);
        else if (!strcmp(k, "--rt-prio")) rt_prio = atoi(v);
        else usage();
    }
    if (!a.ns || !a.dev || !b.ns || !b.dev) usage();
    ring_bytes = align16(ring_bytes < 4 * MAXPKT ? 4 * MAXPKT : ring_bytes);

    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0); /* 1 ns timer slack: steady delay */
    if (rt_prio > 0) { /* a busy machine must not add its run-queue wait to the path's delay */
        struct sched_param sp = {.sched_priority = rt_prio};
        if (sched_setscheduler(0, SCHED_FIFO, &sp) < 0)
            fprintf(stderr, "delayline: SCHED_FIFO %d not set (%s); delay may jitter under load\n",
                    rt_prio, strerror(errno));
    }
    signal(SIGPIPE, SIG_IGN);

    int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (home < 0) die("open", "/proc/self/ns/net");
    a.fd = open_tun_in_ns(a.ns, a.dev, vnet, home);
    b.fd = open_tun_in_ns(b.ns, b.dev, vnet, home);
    close(home);

    struct side *sides[2] = {&a, &b};
    for (int i = 0; i < 2; i++) {
        struct ring *r = &sides[i]->out;
        r->size = ring_bytes;
        r->buf = malloc(ring_bytes);
        if (!r->buf) die("malloc ring", "");
    }

    int ep = epoll_create1(EPOLL_CLOEXEC);
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (ep < 0 || tfd < 0) die("epoll/timerfd", "");
    struct epoll_event ev = {.events = EPOLLIN};
    ev.data.u32 = 0;
    epoll_ctl(ep, EPOLL_CTL_ADD, a.fd, &ev);
    ev.data.u32 = 1;
    epoll_ctl(ep, EPOLL_CTL_ADD, b.fd, &ev);
    ev.data.u32 = 2;
    epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &ev);

    int ctl = -1;
    if (ctl_path) {
        ctl = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        if (strlen(ctl_path) >= sizeof sa.sun_path) { errno = ENAMETOOLONG; die("ctl path", ctl_path); }
        strcpy(sa.sun_path, ctl_path);
        unlink(ctl_path);
        if (bind(ctl, (struct sockaddr *)&sa, sizeof sa) < 0) die("bind", ctl_path);
        ev.data.u32 = 3;
        epoll_ctl(ep, EPOLL_CTL_ADD, ctl, &ev);
    }

    printf("ready pid=%d ring_bytes=%zu delay_us=%llu vnet=%d\n", getpid(), ring_bytes,
           (unsigned long long)(delay / 1000ull), vnet);
    fflush(stdout);

    uint64_t blackhole_until = 0, armed = 0;
    struct epoll_event evs[8];
    for (;;) {
        int n = epoll_wait(ep, evs, 8, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("epoll_wait", "");
        }
        uint64_t now = now_ns();
        for (int i = 0; i < n; i++) {
            uint32_t id = evs[i].data.u32;
            if (id == 0 || id == 1) {
                if (read_side(sides[id], now, delay, blackhole_until) < 0) {
                    fprintf(stderr, "delayline: %s is gone, exiting\n", sides[id]->dev);
                    return 1;
                }
            } else if (id == 2) {
                uint64_t ticks;
                if (read(tfd, &ticks, sizeof ticks) < 0) { /* spurious */ }
                armed = 0;
            } else if (id == 3) {
                char msg[256], reply[1024];
                struct sockaddr_un from;
                socklen_t fl = sizeof from;
                ssize_t m = recvfrom(ctl, msg, sizeof msg - 1, 0, (struct sockaddr *)&from, &fl);
                if (m < 0) continue;
                msg[m] = 0;
                double x;
                if (sscanf(msg, "blackhole %lf", &x) == 1) {
                    blackhole_until = x > 0 ? now_ns() + (uint64_t)(x * 1e9) : 0;
                    snprintf(reply, sizeof reply, "ok blackhole %.3f", x);
                } else if (sscanf(msg, "delay %lf", &x) == 1 && x >= 0) {
                    delay = (uint64_t)(x * 1000.0);
                    snprintf(reply, sizeof reply, "ok delay %.0f", x);
                } else if (!strncmp(msg, "stats", 5)) {
                    snprintf(reply, sizeof reply,
                             "a_rx_pkts=%llu a_rx_bytes=%llu a_tx_pkts=%llu a_tx_bytes=%llu "
                             "b_rx_pkts=%llu b_rx_bytes=%llu b_tx_pkts=%llu b_tx_bytes=%llu "
                             "drop_full=%llu drop_blackhole=%llu drop_write=%llu "
                             "queued_ab=%zu queued_ba=%zu max_queued_ab=%zu max_queued_ba=%zu "
                             "delay_us=%llu blackhole_left_ms=%llu",
                             (unsigned long long)a.rx_pkts, (unsigned long long)a.rx_bytes,
                             (unsigned long long)a.tx_pkts, (unsigned long long)a.tx_bytes,
                             (unsigned long long)b.rx_pkts, (unsigned long long)b.rx_bytes,
                             (unsigned long long)b.tx_pkts, (unsigned long long)b.tx_bytes,
                             (unsigned long long)(a.drop_full + b.drop_full),
                             (unsigned long long)(a.drop_blackhole + b.drop_blackhole),
                             (unsigned long long)(a.drop_write + b.drop_write), a.out.bytes,
                             b.out.bytes, a.out.max_bytes, b.out.max_bytes,
                             (unsigned long long)(delay / 1000ull),
                             (unsigned long long)(blackhole_until > now ? (blackhole_until - now) / 1000000ull : 0));
                } else if (!strncmp(msg, "ping", 4)) {
                    snprintf(reply, sizeof reply, "pong");
                } else {
                    snprintf(reply, sizeof reply, "error unknown command");
                }
                if (fl > sizeof(sa_family_t))
                    sendto(ctl, reply, strlen(reply), 0, (struct sockaddr *)&from, fl);
            }
        }
        now = now_ns();
        uint64_t next_a = flush_side(&a, &b, now, blackhole_until);
        uint64_t next_b = flush_side(&b, &a, now, blackhole_until);
        uint64_t next = next_a && next_b ? (next_a < next_b ? next_a : next_b) : (next_a | next_b);
        if (next != armed) {
            struct itimerspec its;
            memset(&its, 0, sizeof its);
            if (next) {
                its.it_value.tv_sec = (time_t)(next / 1000000000ull);
                its.it_value.tv_nsec = (long)(next % 1000000000ull);
            }
            timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL);
            armed = next;
        }
    }
}
