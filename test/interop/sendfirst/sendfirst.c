/*
 * sendfirst: an rdma_cm application whose server speaks first.
 *
 * The server accepts RUNS connections one after the other; on each it
 * posts a Send the moment it sees RDMA_CM_EVENT_ESTABLISHED, then waits
 * for the client's answer, and disconnects. The client posts a receive,
 * connects, waits for the server's message, checks it and answers with a
 * Send of its own. Nothing else comes from the client before the
 * server's message: on an MPA connection without peer-to-peer mode the
 * client's first FPDU is that answer, so this is the case RFC 5044
 * §7.1.2's startup rule (a responder sends no FPDU before the initiator's
 * first) cannot serve without a bound.
 *
 * Each run prints one line ("run N ok" or "run N FAIL: why"); the end
 * prints "runs: N" and "failures: F", and the exit status is 1 if F > 0.
 * A failed run does not stop the others. It is a plain verbs program
 * (libibverbs, librdmacm): it runs on Linux siw in the peer VM and
 * through libsiwtun (siwtun exec) on the host.
 *
 * usage: sendfirst -s|-c -a ADDR -p PORT [-n RUNS] [-t TIMEOUT_MS]
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

enum { MSG_LEN = 64 };

static int timeout_ms = 10000;

/* One connection's verbs resources. */
struct conn {
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	char buf[2 * MSG_LEN]; /* [0, MSG_LEN): send, [MSG_LEN, 2*MSG_LEN): receive */
};

static char why[256];

static void fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/*
 * next_event waits up to timeout_ms for the channel's next event and
 * returns its type, status and id (a CONNECT_REQUEST's new id), the event
 * acknowledged; -1 on timeout or error.
 */
static int next_event(struct rdma_event_channel *ch, int *status, struct rdma_cm_id **id)
{
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;
	int type;

	if (poll(&pfd, 1, timeout_ms) <= 0) {
		fail("no rdma_cm event within %d ms", timeout_ms);
		return -1;
	}
	if (rdma_get_cm_event(ch, &ev)) {
		fail("rdma_get_cm_event: %s", strerror(errno));
		return -1;
	}
	type = ev->event;
	if (status)
		*status = ev->status;
	if (id)
		*id = ev->id;
	rdma_ack_cm_event(ev);
	return type;
}

/*
 * expect waits for an event of type want on id; anything else on id fails
 * the run. Events of other ids (what the server's earlier connections
 * still report) are skipped.
 */
static int expect(struct rdma_event_channel *ch, struct rdma_cm_id *id, int want)
{
	int status = 0, got;
	struct rdma_cm_id *of;

	do
		got = next_event(ch, &status, &of);
	while (got >= 0 && of != id);
	if (got < 0)
		return -1;
	if (got != want) {
		fail("%s (status %d), want %s", rdma_event_str(got), status, rdma_event_str(want));
		return -1;
	}
	return 0;
}

/* setup makes c's PD, CQ, MR and QP on c->id and posts one receive. */
static int setup(struct conn *c)
{
	struct ibv_qp_init_attr qa = { 0 };
	struct ibv_sge sge;
	struct ibv_recv_wr wr = { 0 }, *bad;

	c->pd = ibv_alloc_pd(c->id->verbs);
	c->cq = c->pd ? ibv_create_cq(c->id->verbs, 8, NULL, NULL, 0) : NULL;
	c->mr = c->cq ? ibv_reg_mr(c->pd, c->buf, sizeof(c->buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!c->mr) {
		fail("PD, CQ or MR: %s", strerror(errno));
		return -1;
	}
	qa.send_cq = c->cq;
	qa.recv_cq = c->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 4;
	qa.cap.max_recv_wr = 4;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	if (rdma_create_qp(c->id, c->pd, &qa)) {
		fail("rdma_create_qp: %s", strerror(errno));
		return -1;
	}
	sge.addr = (uintptr_t)(c->buf + MSG_LEN);
	sge.length = MSG_LEN;
	sge.lkey = c->mr->lkey;
	wr.wr_id = 2;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	if (ibv_post_recv(c->id->qp, &wr, &bad)) {
		fail("ibv_post_recv: %s", strerror(errno));
		return -1;
	}
	return 0;
}

/* post_send sends msg (at most MSG_LEN octets with its NUL), signaled. */
static int post_send(struct conn *c, const char *msg)
{
	struct ibv_sge sge;
	struct ibv_send_wr wr = { 0 }, *bad;

	snprintf(c->buf, MSG_LEN, "%s", msg);
	sge.addr = (uintptr_t)c->buf;
	sge.length = MSG_LEN;
	sge.lkey = c->mr->lkey;
	wr.wr_id = 1;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	if (ibv_post_send(c->id->qp, &wr, &bad)) {
		fail("ibv_post_send: %s", strerror(errno));
		return -1;
	}
	return 0;
}

/*
 * wait_wcs polls until the completions of every wr_id in mask (1: the
 * send, 2: the receive) have come, successful; a receive's message is
 * checked against want.
 */
static int wait_wcs(struct conn *c, unsigned mask, const char *want)
{
	int64_t deadline = now_ms() + timeout_ms;
	struct timespec pause = { 0, 100000 };
	struct ibv_wc wc;

	while (mask) {
		int n = ibv_poll_cq(c->cq, 1, &wc);

		if (n < 0) {
			fail("ibv_poll_cq: %d", n);
			return -1;
		}
		if (n == 0) {
			if (now_ms() > deadline) {
				fail("completions %#x missing after %d ms", mask, timeout_ms);
				return -1;
			}
			nanosleep(&pause, NULL);
			continue;
		}
		if (wc.status != IBV_WC_SUCCESS) {
			fail("%s completion: %s", wc.wr_id == 1 ? "send" : "receive", ibv_wc_status_str(wc.status));
			return -1;
		}
		if (wc.wr_id == 2 && strncmp(c->buf + MSG_LEN, want, MSG_LEN) != 0) {
			fail("received \"%.*s\", want \"%s\"", MSG_LEN, c->buf + MSG_LEN, want);
			return -1;
		}
		mask &= ~(unsigned)wc.wr_id;
	}
	return 0;
}

static void teardown(struct conn *c)
{
	if (c->id && c->id->qp)
		rdma_destroy_qp(c->id);
	if (c->mr)
		ibv_dereg_mr(c->mr);
	if (c->cq)
		ibv_destroy_cq(c->cq);
	if (c->pd)
		ibv_dealloc_pd(c->pd);
	if (c->id)
		rdma_destroy_id(c->id);
	memset(c, 0, sizeof(*c));
}

/* serve_one accepts one connection and speaks first on it. */
static int serve_one(struct rdma_event_channel *ch, int run)
{
	struct conn c = { 0 };
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1 };
	char msg[MSG_LEN], ack[MSG_LEN];
	int status = 0, ret = -1, ev;

	/* What an earlier, failed connection still reports is skipped. */
	do
		ev = next_event(ch, &status, &c.id);
	while (ev >= 0 && ev != RDMA_CM_EVENT_CONNECT_REQUEST);
	if (ev < 0)
		return -1;
	if (setup(&c) || rdma_accept(c.id, &cp)) {
		if (!why[0])
			fail("rdma_accept: %s", strerror(errno));
		goto out;
	}
	if (expect(ch, c.id, RDMA_CM_EVENT_ESTABLISHED))
		goto out;
	/* The server speaks first, at once. */
	snprintf(msg, sizeof(msg), "sendfirst run %d", run);
	snprintf(ack, sizeof(ack), "ack %d", run);
	if (post_send(&c, msg) || wait_wcs(&c, 3, ack))
		goto out;
	/*
	 * The server ends the connection once it has both completions: a
	 * client that closed first could make Linux siw fail the server's
	 * Send it had already sent (its FIN seen before the send call
	 * returned).
	 */
	rdma_disconnect(c.id);
	if (expect(ch, c.id, RDMA_CM_EVENT_DISCONNECTED))
		goto out;
	ret = 0;
out:
	if (ret)
		rdma_disconnect(c.id);
	teardown(&c);
	return ret;
}

/* connect_one connects, checks the server's first message and answers. */
static int connect_one(const char *addr, const char *port, int run)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1, .retry_count = 7 };
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *ai = NULL;
	struct conn c = { 0 };
	char msg[MSG_LEN], ack[MSG_LEN];
	int ret = -1;

	if (!ch) {
		fail("rdma_create_event_channel: %s", strerror(errno));
		return -1;
	}
	if (getaddrinfo(addr, port, &hints, &ai)) {
		fail("getaddrinfo %s:%s failed", addr, port);
		goto out;
	}
	if (rdma_create_id(ch, &c.id, NULL, RDMA_PS_TCP) || rdma_resolve_addr(c.id, NULL, ai->ai_addr, 2000)) {
		fail("rdma_create_id/resolve_addr: %s", strerror(errno));
		goto out;
	}
	if (expect(ch, c.id, RDMA_CM_EVENT_ADDR_RESOLVED))
		goto out;
	if (rdma_resolve_route(c.id, 2000)) {
		fail("rdma_resolve_route: %s", strerror(errno));
		goto out;
	}
	if (expect(ch, c.id, RDMA_CM_EVENT_ROUTE_RESOLVED) || setup(&c))
		goto out;
	if (rdma_connect(c.id, &cp)) {
		fail("rdma_connect: %s", strerror(errno));
		goto out;
	}
	if (expect(ch, c.id, RDMA_CM_EVENT_ESTABLISHED))
		goto out;
	snprintf(msg, sizeof(msg), "sendfirst run %d", run);
	snprintf(ack, sizeof(ack), "ack %d", run);
	if (wait_wcs(&c, 2, msg) || post_send(&c, ack) || wait_wcs(&c, 1, NULL))
		goto out;
	/* The server disconnects. */
	if (expect(ch, c.id, RDMA_CM_EVENT_DISCONNECTED))
		goto out;
	ret = 0;
out:
	if (ai)
		freeaddrinfo(ai);
	teardown(&c);
	rdma_destroy_event_channel(ch);
	return ret;
}

static int listen_on(struct rdma_event_channel *ch, struct rdma_cm_id **lid, const char *addr, const char *port)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE }, *ai;
	int ret = -1;

	if (getaddrinfo(addr, port, &hints, &ai)) {
		fprintf(stderr, "sendfirst: getaddrinfo %s:%s failed\n", addr, port);
		return -1;
	}
	if (rdma_create_id(ch, lid, NULL, RDMA_PS_TCP) || rdma_bind_addr(*lid, ai->ai_addr) || rdma_listen(*lid, 4))
		fprintf(stderr, "sendfirst: listen on %s:%s: %s\n", addr, port, strerror(errno));
	else
		ret = 0;
	freeaddrinfo(ai);
	return ret;
}

int main(int argc, char **argv)
{
	const char *addr = NULL, *port = NULL;
	int server = -1, runs = 1, failures = 0, opt;

	while ((opt = getopt(argc, argv, "sca:p:n:t:")) != -1) {
		switch (opt) {
		case 's':
			server = 1;
			break;
		case 'c':
			server = 0;
			break;
		case 'a':
			addr = optarg;
			break;
		case 'p':
			port = optarg;
			break;
		case 'n':
			runs = atoi(optarg);
			break;
		case 't':
			timeout_ms = atoi(optarg);
			break;
		default:
			server = -1;
			break;
		}
	}
	if (server < 0 || !addr || !port || runs < 1 || timeout_ms < 1) {
		fprintf(stderr, "usage: sendfirst -s|-c -a ADDR -p PORT [-n RUNS] [-t TIMEOUT_MS]\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (server) {
		struct rdma_event_channel *ch = rdma_create_event_channel();
		struct rdma_cm_id *lid = NULL;

		if (!ch || listen_on(ch, &lid, addr, port))
			return 2;
		printf("listening on %s:%s\n", addr, port);
		for (int i = 1; i <= runs; i++) {
			why[0] = 0;
			if (serve_one(ch, i)) {
				failures++;
				printf("run %d FAIL: %s\n", i, why);
			} else {
				printf("run %d ok\n", i);
			}
		}
		rdma_destroy_id(lid);
		rdma_destroy_event_channel(ch);
	} else {
		for (int i = 1; i <= runs; i++) {
			why[0] = 0;
			if (connect_one(addr, port, i)) {
				failures++;
				printf("run %d FAIL: %s\n", i, why);
			} else {
				printf("run %d ok\n", i);
			}
		}
	}
	printf("runs: %d\nfailures: %d\n", runs, failures);
	return failures ? 1 : 0;
}
